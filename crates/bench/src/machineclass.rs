//! machineclass-controller at scale: C MachineClasses and M Machines (100 and 2,000 by default),
//! with the in-process simulated provider (Nodes Ready at once).
//!
//! - converge: controller start until every class carries its finalizer and every Machine is
//!   Running, against the floor of a bare client making the same writes (per class the finalizer;
//!   per machine: finalizer, VM record, Node, two Node status writes, providerID/label, status
//!   Pending, Node sync, status Running) on a fresh kube-sim, each the median of `--runs` runs;
//! - equal concurrency: the floor has what the controller has, `--concurrency` machine workers,
//!   `--class-concurrency` workers for the classes and the Secret running beside them, and one
//!   unbounded task per Node for the Ready patch (the simulated provider's);
//! - writes and reads (get, list, watch) per machine, the controller's and the floor's, both
//!   counted by kube-sim (the bench's own completion watch left out by its User-Agent), and
//!   writes in steady state (from 1 s after convergence; target 0);
//! - the controller's peak RSS.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::machine::{FINALIZER_MCM, Machine, MachineClass};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::accounting::RequestStats;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::cluster::{
    Cluster, Controller, by_verb, by_write, cpu_time, for_each_concurrent, of_client,
};
use crate::report::{Report, Samples, ScalePoint, Series, median, since};

#[derive(clap::Args)]
pub struct Args {
    /// Number of MachineClasses.
    #[arg(long, default_value_t = 100)]
    classes: usize,
    /// Number of Machines (spread evenly over the classes).
    #[arg(long, default_value_t = 2_000)]
    machines: usize,
    /// Several machine counts, comma-separated (e.g. `200,2000,10000`): a scaling curve; overrides `--machines`.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Machine workers: the controller's `--machine-concurrency` and the floor's alike.
    #[arg(long, default_value_t = 10)]
    concurrency: usize,
    /// Class and Secret workers: the controller's `--class-concurrency` and the floor's alike.
    #[arg(long, default_value_t = 4)]
    class_concurrency: usize,
    /// Runs of the controller and of the floor per size (interleaved); times are their medians.
    /// Five, not three: the floor's time varies by a quarter from run to run on a 2-core
    /// machine (its first run also grows this process's heap), and a median of three moved
    /// the ratio by as much.
    #[arg(long, default_value_t = 5)]
    runs: usize,
}

const TIMEOUT: Duration = Duration::from_secs(900);
/// From convergence to the start of the steady-state count.
const SETTLE: Duration = Duration::from_secs(1);
const NS: &str = "default";
/// The floor client's User-Agent product, as kube-sim's accounting names it.
const FLOOR_AGENT: &str = "capstan-bench-floor";
const CONTROLLER_AGENT: &str = "machineclass-controller";

pub async fn run(bin_dir: &Path, args: &Args) -> Result<Report> {
    let sizes = if args.sizes.is_empty() {
        vec![args.machines]
    } else {
        args.sizes.clone()
    };
    let mut reports = Vec::new();
    for machines in sizes {
        reports.push((machines, run_size(bin_dir, args, machines).await?));
    }
    Ok(Report::merge_sizes(reports, "machines"))
}

/// What one run (floor or controller) measured.
struct Run {
    time: Duration,
    curve: Vec<(f64, usize)>,
    /// Every write while converging (kube-sim's resourceVersion moves once per write).
    writes: u64,
    /// The requests of the side under test only (by User-Agent).
    requests: RequestStats,
    /// Controller only: writes in 3 s of steady state, and peak RSS in bytes.
    steady_writes: u64,
    peak_rss: u64,
    /// CPU used while converging: by this process (kube-sim and, for the floor, its client) and
    /// by the controller process (zero for the floor). Their sum over the time says how busy the
    /// machine's cores were, so a reader sees whether a run was bound by CPU or by waiting.
    cpu: Duration,
    controller_cpu: Duration,
}

impl Run {
    fn describe(&self) -> String {
        let busy = (self.cpu + self.controller_cpu).as_secs_f64() / self.time.as_secs_f64();
        format!(
            "{:.2?} (CPU: bench {:.2?}, controller {:.2?}; {busy:.2} cores busy)",
            self.time, self.cpu, self.controller_cpu
        )
    }
}

/// The run whose time is the median (the upper middle one for an even count).
fn median_run(mut runs: Vec<Run>) -> Run {
    runs.sort_by_key(|r| r.time);
    let middle = runs.len() / 2;
    runs.swap_remove(middle)
}

async fn run_size(bin_dir: &Path, args: &Args, machines: usize) -> Result<Report> {
    let scratch = std::env::temp_dir().join(format!("capstan-bench-mc-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let shape = Shape {
        classes: args.classes.max(1),
        machines,
        concurrency: args.concurrency.max(1),
        class_concurrency: args.class_concurrency.max(1),
    };
    let runs = args.runs.max(1);
    let (mut floors, mut controllers) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        eprintln!(
            "machineclass bench: {} classes, {machines} machines, concurrency {}+{}, run {run}/{runs}",
            shape.classes, shape.concurrency, shape.class_concurrency
        );
        let (floor, controller) = (
            floor_run(&scratch, shape).await?,
            controller_run(bin_dir, &scratch, shape).await?,
        );
        eprintln!(
            "machineclass bench: floor {}, controller {}",
            floor.describe(),
            controller.describe()
        );
        floors.push(floor);
        controllers.push(controller);
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let floor_time = median(&floors.iter().map(|r| r.time).collect::<Vec<_>>());
    let controller_time = median(&controllers.iter().map(|r| r.time).collect::<Vec<_>>());
    let peak_rss = controllers.iter().map(|r| r.peak_rss).max().unwrap_or(0);
    let steady_writes = controllers
        .iter()
        .map(|r| r.steady_writes)
        .max()
        .unwrap_or(0);
    let (floor, controller) = (median_run(floors), median_run(controllers));

    let Shape {
        classes,
        concurrency: c,
        class_concurrency: cc,
        ..
    } = shape;
    let mut report = Report::new(format!(
        "machineclass-controller, {classes} classes, {machines} machines, \
         {c} machine and {cc} class workers, median of {runs} runs"
    ));
    report.ratio(
        "converge (finalizers, all machines Running)",
        controller_time,
        floor_time,
        "<= 1.5x",
    );
    let per_machine = |n: u64| n as f64 / machines.max(1) as f64;
    report.per_object(
        "writes per machine to Running",
        per_machine(controller.writes),
        per_machine(floor.writes),
        "both include one write per class and one for the Secret",
    );
    for (figure, verbs) in [
        ("reads (get, list, watch)", &["get", "list", "watch"][..]),
        ("GETs", &["get"][..]),
    ] {
        let count =
            |requests: &RequestStats| requests.count_where(|k| verbs.contains(&k.verb.as_str()));
        report.per_object(
            &format!("{figure} per machine to Running"),
            per_machine(count(&controller.requests)),
            per_machine(count(&floor.requests)),
            &format!(
                "controller by verb: {}; floor by verb: {}",
                by_verb(&controller.requests),
                by_verb(&floor.requests)
            ),
        );
    }
    report.per_object(
        "API requests per machine to Running",
        per_machine(controller.requests.total()),
        per_machine(floor.requests.total()),
        "every verb, the bench's completion watch left out",
    );
    report.row(
        "writes in 3 s of steady state",
        steady_writes.to_string(),
        "target 0 (the most of any run)",
    );
    report.row(
        "controller peak RSS",
        format!("{:.1} MiB", peak_rss as f64 / 1048576.0),
        "target < 64 MiB (the most of any run)",
    );
    report.convergence = vec![
        Series {
            label: "machineclass-controller".to_string(),
            points: controller.curve,
        },
        Series {
            label: "floor (bare client)".to_string(),
            points: floor.curve,
        },
    ];
    report.scaling.push(ScalePoint {
        size: machines,
        seconds: controller_time.as_secs_f64(),
        floor_seconds: floor_time.as_secs_f64(),
        requests: controller.requests.total(),
        peak_rss_mib: peak_rss as f64 / 1048576.0,
    });
    Ok(report)
}

/// Sizes and workers, the same for the floor and the controller.
#[derive(Clone, Copy)]
struct Shape {
    classes: usize,
    machines: usize,
    concurrency: usize,
    class_concurrency: usize,
}

/// The floor: a bare client making the controller's writes on a fresh kube-sim.
async fn floor_run(scratch: &Path, shape: Shape) -> Result<Run> {
    let floor = Cluster::start(scratch, "floor").await?;
    seed(&floor.client, shape.classes, shape.machines).await?;
    let client = floor.client_named(FLOOR_AGENT)?;
    let writes_before = floor.writes();
    let requests_before = floor.sim.requests();
    let converged = wait_for_convergence(&floor, shape.classes, shape.machines);
    let (started, cpu_before) = (Instant::now(), cpu_time(None)?);
    floor_writes(&client, shape).await?;
    let samples = converged.await.context("watch task")??;
    // Converged when the watch saw the last machine Running, as for the controller.
    let time = started.elapsed();
    let cpu = cpu_time(None)? - cpu_before;
    Ok(Run {
        time,
        curve: since(started, samples),
        writes: floor.writes() - writes_before,
        requests: of_client(&floor.sim.requests().since(&requests_before), FLOOR_AGENT),
        steady_writes: 0,
        peak_rss: 0,
        cpu,
        controller_cpu: Duration::ZERO,
    })
}

async fn controller_run(bin_dir: &Path, scratch: &Path, shape: Shape) -> Result<Run> {
    let cluster = Cluster::start(scratch, "controller").await?;
    seed(&cluster.client, shape.classes, shape.machines).await?;
    let writes_before = cluster.writes();
    let requests_before = cluster.sim.requests();
    let converged = wait_for_convergence(&cluster, shape.classes, shape.machines);
    let (started, cpu_before) = (Instant::now(), cpu_time(None)?);
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let (machine_workers, class_workers) = (
        shape.concurrency.to_string(),
        shape.class_concurrency.to_string(),
    );
    let controller = Controller::spawn(
        &bin_dir.join("machineclass-controller"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--metrics-addr",
            "127.0.0.1:0",
            "--namespace",
            NS,
            "--sim-ready-delay",
            "0s",
            "--short-retry",
            "1s",
            "--machine-concurrency",
            &machine_workers,
            "--class-concurrency",
            &class_workers,
            "--log-level",
            "warn",
        ],
    )?;
    let samples = converged.await.context("watch task")??;
    let time = started.elapsed();
    let (cpu, controller_cpu) = (cpu_time(None)? - cpu_before, controller.cpu_time()?);
    let writes = cluster.writes() - writes_before;
    let requests = of_client(
        &cluster.sim.requests().since(&requests_before),
        CONTROLLER_AGENT,
    );

    // Steady state starts once the last trailing reaction of convergence is done: the simulated
    // provider patches a Node Ready in a task of its own, so a Machine can turn Running just before
    // its Node's conditions arrive and are copied into its status.
    tokio::time::sleep(SETTLE).await;
    let writes_before = cluster.writes();
    let steady_before = cluster.sim.requests();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let steady_writes = cluster.writes() - writes_before;
    if steady_writes > 0 {
        let writes = cluster.sim.requests().since(&steady_before);
        eprintln!(
            "machineclass bench: writes in steady state: {}",
            by_write(&writes)
        );
    }
    let peak_rss = controller.peak_rss()?;
    controller.stop().await?;
    Ok(Run {
        time,
        curve: since(started, samples),
        writes,
        requests,
        steady_writes,
        peak_rss,
        cpu,
        controller_cpu,
    })
}

fn class_name(i: usize) -> String {
    format!("mc-{i:03}")
}

fn machine_name(i: usize) -> String {
    format!("m-{i:05}")
}

/// One Secret, the classes and the machines, before anything is timed.
async fn seed(client: &kube::Client, classes: usize, machines: usize) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "cloud", "namespace": NS}, "data": {"k": "dg=="}}),
    )?;
    secrets.create(&PostParams::default(), &secret).await?;
    let class_api: Api<MachineClass> = Api::namespaced(client.clone(), NS);
    for_each_concurrent(0..classes, 16, |i| {
        let api = class_api.clone();
        let class: MachineClass = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineClass",
            "metadata": {"name": class_name(i), "namespace": NS},
            "providerSpec": {}, "provider": "simulated",
            "secretRef": {"name": "cloud", "namespace": NS}
        }))
        .expect("valid class");
        async move { api.create(&PostParams::default(), &class).await.map(drop) }
    })
    .await?;
    let machine_api: Api<Machine> = Api::namespaced(client.clone(), NS);
    for_each_concurrent(0..machines, 16, |i| {
        let api = machine_api.clone();
        let machine: Machine = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": machine_name(i), "namespace": NS},
            "spec": {"class": {"kind": "MachineClass", "name": class_name(i % classes)}}
        }))
        .expect("valid machine");
        async move { api.create(&PostParams::default(), &machine).await.map(drop) }
    })
    .await
}

/// The writes the controller makes, with the controller's concurrency: machine workers
/// (a machine holds one from its finalizer to its Node sync, and again for its Running status, as
/// a reconcile does), class workers (the classes and the Secret) beside them, and the Node Ready
/// patch in a task of its own per Node, as the simulated provider does.
async fn floor_writes(client: &kube::Client, shape: Shape) -> Result<()> {
    let pp = PatchParams::default();
    let class_api: Api<MachineClass> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let class_workers = Arc::new(Semaphore::new(shape.class_concurrency));
    let finalizer = |f: &str| Patch::Merge(json!({"metadata": {"finalizers": [f]}}));
    let classes = for_each_concurrent(0..shape.classes + 1, shape.classes + 1, |i| {
        let (class_api, secrets, pp) = (class_api.clone(), secrets.clone(), pp.clone());
        let workers = class_workers.clone();
        async move {
            let _worker = workers.acquire_owned().await.expect("never closed");
            if i == shape.classes {
                let patch = finalizer("machine.sapcloud.io/machine-controller");
                secrets.patch("cloud", &pp, &patch).await.map(drop)
            } else {
                let patch = finalizer(FINALIZER_MCM);
                class_api.patch(&class_name(i), &pp, &patch).await.map(drop)
            }
        }
    });
    let machine_api: Api<Machine> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(client.clone());
    let vms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let machine_workers = Arc::new(Semaphore::new(shape.concurrency));
    let machines = for_each_concurrent(0..shape.machines, shape.machines.max(1), |i| {
        let (machine_api, nodes, vms, pp) =
            (machine_api.clone(), nodes.clone(), vms.clone(), pp.clone());
        let workers = machine_workers.clone();
        async move {
            let name = machine_name(i);
            let worker = workers.clone().acquire_owned().await.expect("never closed");
            machine_api
                .patch(
                    &name,
                    &pp,
                    &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER_MCM]}})),
                )
                .await?;
            let vm: ConfigMap = serde_json::from_value(
                json!({"metadata": {"name": format!("sim-vm-{name}")}, "data": {"nodeName": name}}),
            )
            .expect("valid configmap");
            vms.create(&PostParams::default(), &vm).await?;
            let node: Node = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"providerID": format!("sim:///{NS}/{name}")}}))
                .expect("valid node");
            nodes.create(&PostParams::default(), &node).await?;
            let cond = |s: &str| {
                Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": s}]}}))
            };
            nodes.patch_status(&name, &pp, &cond("False")).await?;
            let ready = tokio::spawn({
                let (nodes, name, pp) = (nodes.clone(), name.clone(), pp.clone());
                async move {
                    nodes
                        .patch_status(&name, &pp, &cond("True"))
                        .await
                        .map(drop)
                }
            });
            machine_api
                .patch(&name, &pp, &Patch::Merge(json!({"metadata": {"labels": {"node": name}}, "spec": {"providerID": format!("sim:///{NS}/{name}")}})))
                .await?;
            let phase = |p: &str| Patch::Merge(json!({"status": {"currentStatus": {"phase": p}}}));
            machine_api
                .patch_status(&name, &pp, &phase("Pending"))
                .await?;
            nodes
                .patch(&name, &pp, &Patch::Merge(json!({"metadata": {"labels": {"node.gardener.cloud/machine-name": name}, "finalizers": ["node.machine.sapcloud.io/machine-controller"]}})))
                .await?;
            drop(worker);
            ready.await.expect("the Ready task does not panic")?;
            let _worker = workers.acquire_owned().await.expect("never closed");
            machine_api
                .patch_status(&name, &pp, &phase("Running"))
                .await
                .map(drop)
        }
    });
    futures::try_join!(classes, machines)?;
    Ok(())
}

/// Resolves once every class carries the finalizer and every machine is Running, with (when, how
/// many Running) samples on the way; the watches start now, so they see every change made after
/// this call.
fn wait_for_convergence(
    cluster: &Cluster,
    classes: usize,
    machines: usize,
) -> tokio::task::JoinHandle<Result<Vec<(Instant, usize)>>> {
    let machine_api: Api<Machine> = Api::namespaced(cluster.client.clone(), NS);
    let class_api: Api<MachineClass> = Api::namespaced(cluster.client.clone(), NS);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let mut running: HashSet<String> = HashSet::new();
        let mut samples = Samples::new(machines);
        let mut events = std::pin::pin!(
            watcher(machine_api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while running.len() < machines {
            let next = tokio::time::timeout_at(deadline, events.next())
                .await
                .context("timed out")?;
            let Some(machine) = next.transpose()? else {
                bail!("watch ended")
            };
            let name = machine.metadata.name.clone().unwrap_or_default();
            if machine.phase().map(|p| p.as_str()) == Some("Running") {
                if running.insert(name) {
                    samples.record(running.len());
                }
            } else {
                running.remove(&name);
            }
        }
        // Classes get their finalizer before their machines run; confirm it.
        let list = class_api.list(&Default::default()).await?;
        let finalized = list
            .iter()
            .filter(|c| {
                c.metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == FINALIZER_MCM)
            })
            .count();
        if finalized < classes {
            bail!("only {finalized} of {classes} classes carry the finalizer");
        }
        Ok(samples.points)
    })
}
