//! NodeSLO controller at scale: N nodes (10,000 by default).
//!
//! - converge: controller start until every Node has its NodeSLO, against the floor of a bare
//!   client on a kube-sim holding the same N Nodes that lists their names (one metadata-only
//!   request: it must learn which nodes exist, as the controller must) and creates their N
//!   NodeSLOs with the same concurrency (target 1.3x);
//! - fan-out: a ConfigMap change until all N NodeSLOs carry it, against the floor of a bare client
//!   patching N NodeSLOs (same comparison);
//! - both times, and their floors, the median of `--runs` runs;
//! - writes per node on create and on change (target 1), and in steady state (target 0);
//! - the controller's peak RSS (target under 64 MiB).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::slo::{NodeSlo, NodeSloSpec};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::accounting::RequestStats;
use serde_json::json;

use crate::cluster::{Cluster, Controller, by_verb, by_write, for_each_concurrent};
use crate::report::{Report, Samples, ScalePoint, Series, since};

/// The binary under test, also its User-Agent product in kube-sim's accounting.
const CONTROLLER: &str = "nodeslo-controller";

#[derive(clap::Args)]
pub struct Args {
    /// Number of nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Several node counts, comma-separated (e.g. `1000,10000,50000`): a scaling curve; overrides `--nodes`.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Concurrent writes, the controller's `--workers` and the floor client's alike.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Runs per size; each time reported is the median of the runs (its floor's too).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

const TIMEOUT: Duration = Duration::from_secs(600);

pub async fn run(bin_dir: &Path, args: &Args) -> Result<Report> {
    let sizes = if args.sizes.is_empty() {
        vec![args.nodes]
    } else {
        args.sizes.clone()
    };
    let mut reports = Vec::new();
    let runs = args.runs.max(1);
    for n in sizes {
        let mut repeated = Vec::new();
        for run in 1..=runs {
            eprintln!("nodeslo bench: run {run}/{runs}");
            // Both kube-sims live in this process, so the second starts on memory the first
            // freed; at 50,000 nodes the order moved the floor's time by 30 %. It alternates.
            let order = if run % 2 == 1 {
                Order::FloorFirst
            } else {
                Order::ControllerFirst
            };
            repeated.push(run_size(bin_dir, n, args.concurrency, order).await?);
        }
        reports.push((n, Report::median_of(repeated)));
    }
    Ok(Report::merge_sizes(reports, "nodes"))
}

#[derive(Clone, Copy, Debug)]
enum Order {
    FloorFirst,
    ControllerFirst,
}

/// What the floor took: to create every NodeSLO (and its curve), and to patch every one.
struct FloorRun {
    create: Duration,
    curve: Vec<(f64, usize)>,
    update: Duration,
}

/// What the controller took and did, phase by phase.
struct ControllerRun {
    create: Duration,
    curve: Vec<(f64, usize)>,
    create_writes: u64,
    create_requests: RequestStats,
    update: Duration,
    update_requests: RequestStats,
    update_writes: u64,
    record_writes: u64,
    steady_writes: u64,
    peak_rss: u64,
}

async fn run_size(bin_dir: &Path, n: usize, c: usize, order: Order) -> Result<Report> {
    let scratch = std::env::temp_dir().join(format!("capstan-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    eprintln!("nodeslo bench: {n} nodes, concurrency {c}, {order:?}");
    let (floor, run) = match order {
        Order::FloorFirst => {
            let floor = floor_run(&scratch, n, c).await?;
            (floor, controller_run(bin_dir, &scratch, n, c).await?)
        }
        Order::ControllerFirst => {
            let run = controller_run(bin_dir, &scratch, n, c).await?;
            (floor_run(&scratch, n, c).await?, run)
        }
    };
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!(
        "nodeslo bench: converge {:.3?} (floor {:.3?}), config change {:.3?} (floor {:.3?})",
        run.create, floor.create, run.update, floor.update
    );
    Ok(report(n, c, floor, run))
}

/// A bare client making the same writes (the specs the controller computes) with the same
/// concurrency, observed by the same completion watch, on its own kube-sim holding the N Nodes.
async fn floor_run(scratch: &Path, n: usize, c: usize) -> Result<FloorRun> {
    let floor = Cluster::start(scratch, "floor").await?;
    create_nodes(&floor, n).await?;
    let slos: Api<NodeSlo> = Api::all(floor.client.clone());
    let default_spec = spec_with_threshold(None)?;
    let changed_spec = spec_with_threshold(Some(42))?;
    let created = wait_for_percent(&floor, n, 65);
    let started = Instant::now();
    // Names are all the floor needs: a metadata-only list, the cheapest way to learn them.
    let listed = Api::<Node>::all(floor.client.clone())
        .list_metadata(&ListParams::default())
        .await?;
    let names: Vec<String> = listed
        .items
        .into_iter()
        .map(|node| node.name_any())
        .collect();
    for_each_concurrent(names, c, |name| {
        let slos = slos.clone();
        let slo = NodeSlo::new(&name, default_spec.clone());
        async move { slos.create(&PostParams::default(), &slo).await.map(drop) }
    })
    .await?;
    let floor_samples = created.flatten().await?;
    let floor_create = started.elapsed();
    let floor_curve = since(started, floor_samples);
    let updated = wait_for_percent(&floor, n, 42);
    let replace: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/spec", "value": changed_spec}]))?;
    let started = Instant::now();
    for_each_concurrent(0..n, c, |i| {
        let slos = slos.clone();
        let replace = replace.clone();
        async move {
            slos.patch(
                &node_name(i),
                &PatchParams::default(),
                &Patch::Json::<()>(replace),
            )
            .await
            .map(drop)
        }
    })
    .await?;
    updated.flatten().await?;
    Ok(FloorRun {
        create: floor_create,
        curve: floor_curve,
        update: started.elapsed(),
    })
}

/// The controller started on a kube-sim holding the N Nodes, then a config change, then quiet.
async fn controller_run(
    bin_dir: &Path,
    scratch: &Path,
    n: usize,
    c: usize,
) -> Result<ControllerRun> {
    let cluster = Cluster::start(scratch, "controller").await?;
    create_nodes(&cluster, n).await?;
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "koordinator-system"}}))?,
        )
        .await?;

    let writes_before = cluster.writes();
    let requests_before = cluster.sim.requests();
    let converged = wait_for_percent(&cluster, n, 65);
    let started = Instant::now();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    let workers = c.to_string();
    let controller = Controller::spawn(
        &bin_dir.join(CONTROLLER),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--metrics-addr",
            "127.0.0.1:0",
            "--workers",
            &workers,
            "--log-level",
            "warn",
        ],
    )?;
    let samples = converged.flatten().await?;
    let controller_create = started.elapsed();
    let controller_curve = since(started, samples);
    let create_writes = cluster.writes() - writes_before;
    let create_requests = cluster.sim.requests().since(&requests_before);

    // A config change that reaches every NodeSLO.
    let configs: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "koordinator-system");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
        "data": {"resource-threshold-config": r#"{"clusterStrategy":{"cpuSuppressThresholdPercent":42}}"#}
    }))?;
    let updated = wait_for_percent(&cluster, n, 42);
    let writes_before = cluster.writes();
    let requests_before = cluster.sim.requests();
    let started = Instant::now();
    configs.create(&PostParams::default(), &cm).await?;
    updated.flatten().await?;
    let controller_update = started.elapsed();
    let update_requests = cluster.sim.requests().since(&requests_before);
    // The controller also records the last good config: one ConfigMap write per change whatever
    // the node count, reported apart from the per-node figure (the bench's own create is the -1).
    let record_writes = update_requests.count_where(|k| {
        k.client == CONTROLLER
            && k.resource == "configmaps"
            && !matches!(k.verb.as_str(), "get" | "list" | "watch")
    });
    let update_writes = cluster.writes() - writes_before - 1 - record_writes;
    if update_writes > n as u64 {
        eprintln!(
            "nodeslo bench: {} writes for {n} nodes on config change: {}",
            update_writes,
            by_write(&update_requests)
        );
    }

    // Steady state: nothing changes, nothing is written.
    let writes_before = cluster.writes();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let steady_writes = cluster.writes() - writes_before;
    let peak_rss = controller.peak_rss()?;
    controller.stop().await?;
    Ok(ControllerRun {
        create: controller_create,
        curve: controller_curve,
        create_writes,
        create_requests,
        update: controller_update,
        update_requests,
        update_writes,
        record_writes,
        steady_writes,
        peak_rss,
    })
}

fn report(n: usize, c: usize, floor: FloorRun, run: ControllerRun) -> Report {
    let mut report = Report::new(format!("nodeslo-controller, {n} nodes, concurrency {c}"));
    report.ratio(
        "converge (create all NodeSLOs)",
        run.create,
        floor.create,
        "<= 1.3x",
    );
    report.ratio(
        "config change reaches all NodeSLOs",
        run.update,
        floor.update,
        "<= 1.3x",
    );
    let per_node = |writes: u64| format!("{:.3}", writes as f64 / n as f64);
    report.row(
        "writes per node on create",
        per_node(run.create_writes),
        "target 1 (reads: list+watch only, no per-node GET)",
    );
    report.row(
        "writes per node on config change",
        per_node(run.update_writes),
        "target 1",
    );
    report.row(
        "last-good config records written on config change",
        run.record_writes.to_string(),
        "one per change, not per node",
    );
    // Every request kube-sim served in the phase (the bench's own completion watch and ConfigMap
    // create included: a constant 2-3), by verb.
    for (phase, requests) in [
        ("create", &run.create_requests),
        ("config change", &run.update_requests),
    ] {
        let gets = requests.count_where(|k| k.verb == "get");
        report.row(
            format!("API requests per node on {phase}"),
            per_node(requests.total()),
            format!(
                "{} in all, {gets} GETs; by verb: {}",
                requests.total(),
                by_verb(requests)
            ),
        );
    }
    report.row(
        "writes in 3 s of steady state",
        run.steady_writes.to_string(),
        "target 0",
    );
    report.row(
        "controller peak RSS",
        format!("{:.1} MiB", run.peak_rss as f64 / 1048576.0),
        "target < 64 MiB",
    );
    report.convergence = vec![
        Series {
            label: CONTROLLER.to_string(),
            points: run.curve,
        },
        Series {
            label: "floor (bare client)".to_string(),
            points: floor.curve,
        },
    ];
    report.scaling.push(ScalePoint {
        size: n,
        seconds: run.create.as_secs_f64(),
        floor_seconds: floor.create.as_secs_f64(),
        requests: run.create_requests.total(),
        peak_rss_mib: run.peak_rss as f64 / 1048576.0,
    });
    report
}

/// The spec the controller writes for an unlabelled node, optionally with the cluster's
/// `cpuSuppressThresholdPercent` changed.
fn spec_with_threshold(percent: Option<i64>) -> Result<NodeSloSpec> {
    let data: BTreeMap<String, String> = percent
        .map(|p| {
            (
                "resource-threshold-config".to_string(),
                format!(r#"{{"clusterStrategy":{{"cpuSuppressThresholdPercent":{p}}}}}"#),
            )
        })
        .into_iter()
        .collect();
    let config = nodeslo_core::MergedConfig::from_config_map(
        Some(&data),
        &nodeslo_core::MergedConfig::default(),
    )
    .config;
    match nodeslo_core::decide(Some(&nodeslo_core::NodeFacts::default()), None, &config)?.decision {
        nodeslo_core::Decision::Create(spec) => Ok(spec),
        other => bail!("unexpected decision {other:?}"),
    }
}

/// The N Nodes both the floor and the controller start from.
pub(crate) async fn create_nodes(cluster: &Cluster, n: usize) -> Result<()> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    for_each_concurrent(0..n, 16, |i| {
        let nodes = nodes.clone();
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": node_name(i), "labels": {"pool": format!("p{}", i % 4)}}}),
        )
        .expect("valid node");
        async move { nodes.create(&PostParams::default(), &node).await.map(drop) }
    })
    .await
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// Resolves once `n` NodeSLOs have `cpuSuppressThresholdPercent == percent`, with (when, how
/// many) samples of the count on the way; the watch starts now, so it sees every change made
/// after this call.
fn wait_for_percent(
    cluster: &Cluster,
    n: usize,
    percent: i64,
) -> tokio::task::JoinHandle<Result<Vec<(Instant, usize)>>> {
    let api: Api<NodeSlo> = Api::all(cluster.client.clone());
    tokio::spawn(async move {
        let mut done: HashSet<String> = HashSet::new();
        let mut samples = Samples::new(n);
        let mut events = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while done.len() < n {
            let next = tokio::time::timeout_at(deadline, events.next())
                .await
                .context("timed out")?;
            let Some(slo) = next.transpose()? else {
                bail!("watch ended")
            };
            let value = slo
                .spec
                .resource_used_threshold_with_be
                .and_then(|t| t.cpu_suppress_threshold_percent);
            let name = slo.metadata.name.unwrap_or_default();
            if value == Some(percent) && done.insert(name) {
                samples.record(done.len());
            }
        }
        Ok(samples.points)
    })
}

trait Flatten<T> {
    async fn flatten(self) -> Result<T>;
}

impl<T> Flatten<T> for tokio::task::JoinHandle<Result<T>> {
    async fn flatten(self) -> Result<T> {
        self.await.context("watch task")?
    }
}
