//! machineclass-controller at scale: C MachineClasses and M Machines (100 and 2,000 by default),
//! with the in-process simulated provider (Nodes Ready at once).
//!
//! - converge: controller start until every class carries its finalizer and every Machine is
//!   Running, against the floor of a bare client making the same writes (per class the finalizer;
//!   per machine: finalizer, VM record, Node, two Node status writes, providerID/label, status
//!   Pending, Node sync, status Running) with the same concurrency on a fresh kube-sim;
//! - writes per machine (every write moves kube-sim's resourceVersion), and in steady state (target 0);
//! - API requests per machine (every verb) while converging;
//! - the controller's peak RSS.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::machine::{FINALIZER_MCM, Machine, MachineClass};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::cluster::{Cluster, Controller};
use crate::report::{Report, Samples, ScalePoint, Series, since};

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
    /// Concurrent writes: the controller's `--machine-concurrency` and the floor client's alike.
    #[arg(long, default_value_t = 10)]
    concurrency: usize,
}

const TIMEOUT: Duration = Duration::from_secs(900);
const NS: &str = "default";

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

async fn run_size(bin_dir: &Path, args: &Args, machines: usize) -> Result<Report> {
    let scratch = std::env::temp_dir().join(format!("capstan-bench-mc-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let (classes, c) = (args.classes.max(1), args.concurrency.max(1));
    eprintln!("machineclass bench: {classes} classes, {machines} machines, concurrency {c}");

    // Floor: the same writes by a bare client.
    let floor = Cluster::start(&scratch, "floor").await?;
    seed(&floor.client, classes, machines).await?;
    let floor_converged = wait_for_convergence(&floor, classes, machines);
    let started = Instant::now();
    floor_writes(&floor.client, classes, machines, c).await?;
    let floor_time = started.elapsed();
    let floor_curve = since(started, floor_converged.await.context("watch task")??);
    drop(floor);

    // The controller.
    let cluster = Cluster::start(&scratch, "controller").await?;
    seed(&cluster.client, classes, machines).await?;
    let writes_before = cluster.writes();
    let requests_before = cluster.sim.requests();
    let converged = wait_for_convergence(&cluster, classes, machines);
    let started = Instant::now();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let concurrency = c.to_string();
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
            &concurrency,
            "--log-level",
            "warn",
        ],
    )?;
    let samples = converged.await.context("watch task")??;
    let controller_time = started.elapsed();
    let controller_curve = since(started, samples);
    let converge_writes = cluster.writes() - writes_before;
    let converge_requests = cluster.sim.requests().since(&requests_before).total();

    let writes_before = cluster.writes();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let steady_writes = cluster.writes() - writes_before;
    let peak_rss = controller.peak_rss()?;
    controller.stop().await?;
    let _ = std::fs::remove_dir_all(&scratch);

    let mut report = Report::new(format!(
        "machineclass-controller, {classes} classes, {machines} machines, concurrency {c}"
    ));
    report.ratio(
        "converge (finalizers, all machines Running)",
        controller_time,
        floor_time,
        "<= 1.5x",
    );
    report.row(
        "writes per machine to Running",
        format!("{:.2}", converge_writes as f64 / machines.max(1) as f64),
        format!("floor {FLOOR_WRITES_PER_MACHINE}, plus one per class and one for the secret"),
    );
    report.row(
        "API requests per machine to Running",
        format!("{:.2}", converge_requests as f64 / machines.max(1) as f64),
        format!("{converge_requests} in all, the bench's completion watch included"),
    );
    report.row(
        "writes in 3 s of steady state",
        steady_writes.to_string(),
        "target 0",
    );
    report.row(
        "controller peak RSS",
        format!("{:.1} MiB", peak_rss as f64 / 1048576.0),
        "target < 128 MiB",
    );
    report.convergence = vec![
        Series {
            label: "machineclass-controller".to_string(),
            points: controller_curve,
        },
        Series {
            label: "floor (bare client)".to_string(),
            points: floor_curve,
        },
    ];
    report.scaling.push(ScalePoint {
        size: machines,
        seconds: controller_time.as_secs_f64(),
        floor_seconds: floor_time.as_secs_f64(),
        requests: converge_requests,
        peak_rss_mib: peak_rss as f64 / 1048576.0,
    });
    Ok(report)
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
    for_each_concurrent(classes, 16, |i| {
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
    for_each_concurrent(machines, 16, |i| {
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

/// Writes the controller must make per machine, issued by the floor client.
const FLOOR_WRITES_PER_MACHINE: usize = 9;

async fn floor_writes(
    client: &kube::Client,
    classes: usize,
    machines: usize,
    c: usize,
) -> Result<()> {
    let merge = |v: Value| Patch::Merge(v);
    let pp = PatchParams::default();
    let class_api: Api<MachineClass> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .patch(
            "cloud",
            &pp,
            &merge(json!({"metadata": {"finalizers": ["machine.sapcloud.io/machine-controller"]}})),
        )
        .await?;
    for_each_concurrent(classes, c, |i| {
        let api = class_api.clone();
        let pp = pp.clone();
        async move {
            api.patch(
                &class_name(i),
                &pp,
                &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER_MCM]}})),
            )
            .await
            .map(drop)
        }
    })
    .await?;
    let machine_api: Api<Machine> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(client.clone());
    let vms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    for_each_concurrent(machines, c, |i| {
        let (machine_api, nodes, vms, pp) = (machine_api.clone(), nodes.clone(), vms.clone(), pp.clone());
        async move {
            let name = machine_name(i);
            machine_api.patch(&name, &pp, &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER_MCM]}}))).await?;
            let vm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("sim-vm-{name}")}, "data": {"nodeName": name}}))
                .expect("valid configmap");
            vms.create(&PostParams::default(), &vm).await?;
            let node: Node = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"providerID": format!("sim:///{NS}/{name}")}}))
                .expect("valid node");
            nodes.create(&PostParams::default(), &node).await?;
            let cond = |s: &str| json!({"status": {"conditions": [{"type": "Ready", "status": s}]}});
            nodes.patch_status(&name, &pp, &Patch::Merge(cond("False"))).await?;
            nodes.patch_status(&name, &pp, &Patch::Merge(cond("True"))).await?;
            machine_api
                .patch(&name, &pp, &Patch::Merge(json!({"metadata": {"labels": {"node": name}}, "spec": {"providerID": format!("sim:///{NS}/{name}")}})))
                .await?;
            let phase = |p: &str| json!({"status": {"currentStatus": {"phase": p}}});
            machine_api.patch_status(&name, &pp, &Patch::Merge(phase("Pending"))).await?;
            nodes
                .patch(&name, &pp, &Patch::Merge(json!({"metadata": {"labels": {"node.gardener.cloud/machine-name": name}, "finalizers": ["node.machine.sapcloud.io/machine-controller"]}})))
                .await?;
            machine_api.patch_status(&name, &pp, &Patch::Merge(phase("Running"))).await.map(drop)
        }
    })
    .await
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

/// Runs `op(0..n)` with at most `concurrency` in flight; the first error stops it.
async fn for_each_concurrent<F, Fut>(n: usize, concurrency: usize, op: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    stream::iter(0..n)
        .map(op)
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}
