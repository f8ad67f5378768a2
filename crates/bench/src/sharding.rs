//! nodeslo-controller sharded (`--shards auto`) at scale: N Nodes (50,000 by default), 1, 2 and
//! 4 replicas, in both modes (every replica watches all Nodes; `--shard-node-labels`: the
//! sharder labels Nodes too and each replica watches only its own), each run on a fresh
//! kube-sim holding the N Nodes, as the nodeslo suite's controller run.
//!
//! - peak RSS per replica (`VmHWM`, the largest replica's), against one replica of the same
//!   binary in the same mode (`--shards auto`, one replica): with 4, each <= 0.35x; the unsharded
//!   run's (`--shards off`) is a row of its own;
//! - writes per Node, from replica start until a config change reached every NodeSLO, counted by
//!   kube-sim's request accounting (the controller's User-Agent product): NodeSLO writes against
//!   the unsharded run's (equal, target 1x); the sharder's Node label writes apart; Leases,
//!   Events and the last-good ConfigMap in a row of their own;
//! - converging and the config change against the unsharded run (no target: the replicas share
//!   the machine's cores);
//! - takeover: with the most replicas converged, `kill -9` one that is not the leader and change
//!   the config at once; the time until every NodeSLO it owned carries a live shard's label, and
//!   until they also carry the new config, against the lease duration (`--lease-seconds`, short
//!   so the figure is quick), the median of `--kills` kills (the killed replica restarts and gets
//!   its share back between kills).
//!
//! Converged means every NodeSLO carries the config's value and, sharded, a live shard's label
//! without a drain, each shard owning its share (n/R ± 15 %, wider at tiny sizes), as the sharding
//! scenarios check.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use capstan_apis::slo::NodeSlo;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube_sim::accounting::RequestStats;
use serde_json::json;

use crate::cluster::{Cluster, Controller, of_client};
use crate::report::{Chart, Line, Report, Series, median, since};

mod report;
mod track;

use report::report;
use track::*;

/// The binary under test, also its User-Agent product in kube-sim's accounting.
const CONTROLLER: &str = "nodeslo-controller";
const RING_LABEL: &str = "shard.sharding.capstan.dev/nodeslo";
const DRAIN_LABEL: &str = "drain.sharding.capstan.dev/nodeslo";
/// The leader Lease (the binary's name) and the shard Leases live here (`--lease-namespace`).
const LEASE_NAMESPACE: &str = "default";
const LEADER_LEASE: &str = CONTROLLER;
const CONFIG_NAMESPACE: &str = "koordinator-system";
const CONFIG_NAME: &str = "slo-controller-config";
/// The value the controller writes without a config, then the bench's config change.
const DEFAULT_PERCENT: i64 = 65;
const CHANGED_PERCENT: i64 = 42;
/// The config value of the k-th kill's change.
const KILL_PERCENT: i64 = 50;
/// The RSS goal of the issue, with 4 replicas.
const RSS_GOAL: f64 = 0.35;
const RSS_GOAL_REPLICAS: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(600);
const STEADY: Duration = Duration::from_secs(3);
/// kube-sim counts a request once its response is built, after the watch event of its write
/// went out: the bench waits this long after a phase's last event before reading the counts, or
/// the last write would count in the next phase.
const COUNTED: Duration = Duration::from_millis(250);

#[derive(clap::Args)]
pub struct Args {
    /// Number of Nodes.
    #[arg(long, default_value_t = 50_000)]
    nodes: usize,
    /// Replica counts, comma-separated; 1 (the baseline) is always run.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    replicas: Vec<usize>,
    /// Each replica's `--workers`, the unsharded run's too.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// The replicas' `--lease-duration-seconds` (shard and leader Leases).
    #[arg(long, default_value_t = 4)]
    lease_seconds: u64,
    /// The replicas' `--lease-grace-seconds` (tolerated = duration - grace).
    #[arg(long, default_value_t = 2)]
    lease_grace_seconds: u64,
    /// Replicas killed one after another in the largest run of each mode; the takeover times
    /// are their medians (0: no takeover).
    #[arg(long, default_value_t = 3)]
    kills: usize,
}

/// What one run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// `--shards off`, one replica, as the nodeslo suite runs it.
    Unsharded,
    Sharded {
        mode: Mode,
        replicas: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Every replica watches all Nodes; only NodeSLOs are labelled.
    AllNodes,
    /// `--shard-node-labels`: Nodes are labelled too, each replica watches its own.
    NodeLabels,
}

impl Mode {
    const ALL: [Mode; 2] = [Mode::AllNodes, Mode::NodeLabels];

    fn name(self) -> &'static str {
        match self {
            Mode::AllNodes => "all Nodes watched",
            Mode::NodeLabels => "--shard-node-labels",
        }
    }
}

/// Writes by what they wrote, of one run's phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Writes {
    nodeslos: u64,
    /// Of `nodeslos`, those answered with an error (409 conflicts).
    nodeslos_failed: u64,
    nodes: u64,
    leases: u64,
    events: u64,
    configmaps: u64,
    other: u64,
}

impl Writes {
    fn plus(self, other: Self) -> Self {
        Self {
            nodeslos: self.nodeslos + other.nodeslos,
            nodeslos_failed: self.nodeslos_failed + other.nodeslos_failed,
            nodes: self.nodes + other.nodes,
            leases: self.leases + other.leases,
            events: self.events + other.events,
            configmaps: self.configmaps + other.configmaps,
            other: self.other + other.other,
        }
    }

    /// The controller's writes among `requests`, any response code.
    fn of(requests: &RequestStats) -> Self {
        let mut writes = Self::default();
        for (key, n) in &of_client(requests, CONTROLLER).counts {
            if !key.is_write() {
                continue;
            }
            let slot = match key.resource.as_str() {
                "nodeslos" => {
                    if key.code >= 400 {
                        writes.nodeslos_failed += n;
                    }
                    &mut writes.nodeslos
                }
                "nodes" => &mut writes.nodes,
                "leases" => &mut writes.leases,
                "events" => &mut writes.events,
                "configmaps" => &mut writes.configmaps,
                _ => &mut writes.other,
            };
            *slot += n;
        }
        writes
    }
}

/// One takeover: times since the kill.
#[derive(Clone, Debug, Default)]
struct Takeover {
    victim: String,
    /// NodeSLOs the victim owned.
    owned: usize,
    /// Until every one carried a live shard's label.
    labelled: Duration,
    /// Until every one also carried the config changed at the kill.
    reconciled: Duration,
    /// Until the other NodeSLOs (the live shards' own) carried it.
    rest: Duration,
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
struct Run {
    converge: Duration,
    curve: Vec<(f64, usize)>,
    update: Duration,
    /// From start until every NodeSLO was created.
    create_writes: Writes,
    /// From the config change until it reached every NodeSLO.
    update_writes: Writes,
    /// NodeSLO and Node writes in [`STEADY`] after that.
    steady_writes: u64,
    /// Peak RSS per replica id, bytes.
    rss: BTreeMap<String, u64>,
    /// Peak RSS of one replica of this setup on a cluster without Nodes: what the process costs
    /// before any object (its code pages, runtime, clients), bytes.
    idle_rss: u64,
    leader: Option<String>,
    /// NodeSLOs per shard once converged (sharded only).
    shares: BTreeMap<String, usize>,
    takeovers: Vec<Takeover>,
    /// Replicas that did not exit 0 on SIGTERM at the end.
    unclean_exits: usize,
}

impl Run {
    fn max_rss(&self) -> u64 {
        self.rss.values().copied().max().unwrap_or(0)
    }

    /// The largest RSS among the replicas that did not lead (the leader also runs the sharders).
    fn max_rss_followers(&self) -> Option<u64> {
        self.rss
            .iter()
            .filter(|(id, _)| Some(*id) != self.leader.as_ref())
            .map(|(_, rss)| *rss)
            .max()
    }
}

pub async fn run(bin_dir: &Path, args: &Args) -> Result<Report> {
    let mut replicas = args.replicas.clone();
    replicas.push(1);
    replicas.retain(|r| *r > 0);
    replicas.sort_unstable();
    replicas.dedup();
    let most = *replicas.last().unwrap_or(&1);
    let scratch = std::env::temp_dir().join(format!("capstan-bench-sh-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let n = args.nodes.max(1);
    eprintln!("sharding bench: {n} nodes, unsharded");
    let unsharded = run_once(bin_dir, &scratch, args, Setup::Unsharded, 0).await?;
    let mut sharded = Vec::new();
    for mode in Mode::ALL {
        for &r in &replicas {
            let kills = if r == most && r >= 2 { args.kills } else { 0 };
            eprintln!(
                "sharding bench: {n} nodes, {}, {r} replica(s), {kills} kill(s)",
                mode.name()
            );
            let setup = Setup::Sharded { mode, replicas: r };
            let run = run_once(bin_dir, &scratch, args, setup, kills).await?;
            sharded.push((mode, r, run));
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(report(args, &unsharded, &sharded))
}

/// The replica ids of a run of `r` replicas.
fn ids(r: usize) -> Vec<String> {
    (0..r).map(|i| format!("nodeslo-{i}")).collect()
}

struct Replicas {
    bin: PathBuf,
    scratch: PathBuf,
    kubeconfig: String,
    workers: String,
    lease: String,
    grace: String,
    setup: Setup,
    running: BTreeMap<String, Controller>,
    /// Starts per id, so a restarted replica logs to a file of its own.
    starts: BTreeMap<String, usize>,
}

impl Replicas {
    /// None running yet: replicas of `setup` on `cluster`, logging under `scratch`.
    fn new(bin_dir: &Path, scratch: PathBuf, cluster: &Cluster, args: &Args, setup: Setup) -> Self {
        Self {
            bin: bin_dir.join(CONTROLLER),
            scratch,
            kubeconfig: cluster.kubeconfig.to_string_lossy().into_owned(),
            workers: args.workers.max(1).to_string(),
            lease: args.lease_seconds.to_string(),
            grace: args.lease_grace_seconds.to_string(),
            setup,
            running: BTreeMap::new(),
            starts: BTreeMap::new(),
        }
    }

    fn start(&mut self, id: &str) -> Result<()> {
        let mut argv = vec![
            "--kubeconfig",
            &self.kubeconfig,
            "--metrics-addr",
            "127.0.0.1:0",
            "--workers",
            &self.workers,
            "--log-level",
            "warn",
        ];
        match self.setup {
            Setup::Unsharded => argv.extend(["--shards", "off"]),
            Setup::Sharded { mode, .. } => {
                argv.extend([
                    "--shards",
                    "auto",
                    "--leader-elect",
                    "--lease-identity",
                    id,
                    "--lease-duration-seconds",
                    &self.lease,
                    "--lease-grace-seconds",
                    &self.grace,
                ]);
                if mode == Mode::NodeLabels {
                    argv.push("--shard-node-labels");
                }
            }
        }
        let start = self.starts.entry(id.to_string()).or_default();
        *start += 1;
        let log = self.scratch.join(format!("{id}.{start}.log"));
        let controller = Controller::spawn_logging(&self.bin, &argv, Some(&log))?;
        self.running.insert(id.to_string(), controller);
        Ok(())
    }

    /// The last lines of every replica's logs (every start), for a run that did not converge.
    fn log_tails(&self) -> String {
        let mut out = String::new();
        for (id, starts) in &self.starts {
            for start in 1..=*starts {
                let path = self.scratch.join(format!("{id}.{start}.log"));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                out.push_str(&format!(
                    "--- {id} (start {start}, {}):\n{}\n",
                    path.display(),
                    lines[lines.len().saturating_sub(30)..].join("\n")
                ));
            }
        }
        out
    }

    /// SIGTERM to all at once (one by one, each leaving would hand its share to the others),
    /// then waits; returns how many did not exit 0.
    async fn stop_all(&mut self) -> usize {
        let running = std::mem::take(&mut self.running);
        let stops = running.into_iter().map(|(id, replica)| async move {
            replica
                .stop()
                .await
                .map_err(|error| eprintln!("sharding bench: {id} on SIGTERM: {error:#}"))
                .is_err()
        });
        futures::future::join_all(stops)
            .await
            .into_iter()
            .filter(|failed| *failed)
            .count()
    }
}

async fn run_once(
    bin_dir: &Path,
    scratch: &Path,
    args: &Args,
    setup: Setup,
    kills: usize,
) -> Result<Run> {
    let n = args.nodes.max(1);
    let name = match setup {
        Setup::Unsharded => "unsharded".to_string(),
        Setup::Sharded { mode, replicas } => format!("{mode:?}-{replicas}"),
    };
    let run_dir = scratch.join(&name);
    std::fs::create_dir_all(&run_dir)?;
    let idle_rss = idle_rss(bin_dir, &run_dir, args, setup).await?;
    let cluster = Cluster::start(&run_dir, &name).await?;
    let created = Instant::now();
    crate::nodeslo::create_nodes(&cluster, n).await?;
    eprintln!(
        "sharding bench: {n} Nodes created in {:.1?}",
        created.elapsed()
    );
    Api::<Namespace>::all(cluster.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": CONFIG_NAMESPACE}}))?,
        )
        .await?;
    let mut replicas = Replicas::new(bin_dir, run_dir.clone(), &cluster, args, setup);
    let result = measure(&cluster, &mut replicas, args, kills).await;
    let unclean_exits = replicas.stop_all().await;
    if result.is_err() || unclean_exits > 0 {
        eprintln!("{}", replicas.log_tails());
    }
    let mut run = result?;
    run.unclean_exits = unclean_exits;
    run.idle_rss = idle_rss;
    let _ = std::fs::remove_dir_all(&run_dir);
    Ok(run)
}

/// The peak RSS of one replica of `setup` on a cluster of its own without Nodes, once it has
/// settled (sharded: leading, so that its sharders run).
async fn idle_rss(bin_dir: &Path, run_dir: &Path, args: &Args, setup: Setup) -> Result<u64> {
    let dir = run_dir.join("idle");
    std::fs::create_dir_all(&dir)?;
    let cluster = Cluster::start(&dir, "idle").await?;
    let mut replicas = Replicas::new(bin_dir, dir.clone(), &cluster, args, setup);
    let id = "nodeslo-0";
    replicas.start(id)?;
    if matches!(setup, Setup::Sharded { .. }) {
        let deadline = Instant::now() + TIMEOUT;
        while leader(&cluster).await?.as_deref() != Some(id) {
            if Instant::now() > deadline {
                bail!("the idle replica did not lead:\n{}", replicas.log_tails());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(STEADY).await;
    let rss = replicas.running[id].peak_rss()?;
    replicas.stop_all().await;
    drop(cluster);
    Ok(rss)
}

async fn measure(
    cluster: &Cluster,
    replicas: &mut Replicas,
    args: &Args,
    kills: usize,
) -> Result<Run> {
    let n = args.nodes.max(1);
    let ids = match replicas.setup {
        Setup::Unsharded => vec!["nodeslo".to_string()],
        Setup::Sharded { replicas, .. } => ids(replicas),
    };
    let shards = matches!(replicas.setup, Setup::Sharded { .. }).then(|| ids.clone());
    let goal = |percent| Goal {
        percent: Some(percent),
        shards: shards.clone(),
        scope: Scope::All(n),
        fair_shares: shards.is_some(),
    };

    let requests_before = cluster.sim.requests();
    let converged = Tracker::start(cluster.client.clone(), vec![goal(DEFAULT_PERCENT)]).await?;
    let started = Instant::now();
    for id in &ids {
        replicas.start(id)?;
    }
    let reached = converged.wait().await.context("converging")?;
    let converge = reached.at[0].saturating_duration_since(started);
    let curve = since(started, reached.samples);
    let shares = reached.shares;
    tokio::time::sleep(COUNTED).await;
    let create_writes = Writes::of(&cluster.sim.requests().since(&requests_before));
    eprintln!(
        "sharding bench: converged in {converge:.2?}, shares {shares:?}, writes {create_writes:?}"
    );

    let configs: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), CONFIG_NAMESPACE);
    let updated = Tracker::start(cluster.client.clone(), vec![goal(CHANGED_PERCENT)]).await?;
    let requests_before = cluster.sim.requests();
    let started = Instant::now();
    configs
        .create(&PostParams::default(), &config_map(CHANGED_PERCENT)?)
        .await?;
    let reached = updated.wait().await.context("config change")?;
    let update = reached.at[0].saturating_duration_since(started);
    tokio::time::sleep(COUNTED).await;
    let update_writes = Writes::of(&cluster.sim.requests().since(&requests_before));
    eprintln!("sharding bench: config change in {update:.2?}, writes {update_writes:?}");

    let steady_before = cluster.sim.requests();
    tokio::time::sleep(STEADY).await;
    let steady = Writes::of(&cluster.sim.requests().since(&steady_before));
    let steady_writes = steady.nodeslos + steady.nodes;

    let mut rss = BTreeMap::new();
    for (id, replica) in &replicas.running {
        rss.insert(id.clone(), replica.peak_rss()?);
    }
    let leader = match replicas.setup {
        Setup::Unsharded => None,
        Setup::Sharded { .. } => leader(cluster).await?,
    };

    let mut takeovers = Vec::new();
    for kill in 0..kills {
        let percent = KILL_PERCENT + kill as i64;
        takeovers.push(takeover(cluster, replicas, &ids, n, kill, percent).await?);
    }
    Ok(Run {
        converge,
        curve,
        update,
        create_writes,
        update_writes,
        steady_writes,
        rss,
        idle_rss: 0,
        leader,
        shares,
        takeovers,
        unclean_exits: 0,
    })
}

/// Kills a replica that does not lead (the `kill`-th of them, in turn), changes the config at
/// once, times its NodeSLOs' takeover, then restarts it and waits until it owns its share again.
async fn takeover(
    cluster: &Cluster,
    replicas: &mut Replicas,
    ids: &[String],
    n: usize,
    kill: usize,
    percent: i64,
) -> Result<Takeover> {
    let leader = leader(cluster).await?;
    let followers: Vec<&String> = ids
        .iter()
        .filter(|id| Some(*id) != leader.as_ref())
        .collect();
    let Some(victim) = followers
        .get(kill % followers.len().max(1))
        .map(|id| (*id).clone())
    else {
        bail!("no replica but the leader {leader:?} to kill");
    };
    let live: Vec<String> = ids.iter().filter(|id| **id != victim).cloned().collect();
    let slos: Api<NodeSlo> = Api::all(cluster.client.clone());
    let owned: HashSet<String> = slos
        .list_metadata(&ListParams::default().labels(&format!("{RING_LABEL}={victim}")))
        .await?
        .items
        .into_iter()
        .filter_map(|slo| slo.metadata.name)
        .collect();
    let owned = Arc::new(owned);
    let goals = vec![
        Goal {
            percent: None,
            shards: Some(live.clone()),
            scope: Scope::Only(owned.clone()),
            fair_shares: false,
        },
        Goal {
            percent: Some(percent),
            shards: Some(live.clone()),
            scope: Scope::Only(owned.clone()),
            fair_shares: false,
        },
        Goal {
            percent: Some(percent),
            shards: Some(live.clone()),
            scope: Scope::Except(owned.clone(), n),
            fair_shares: false,
        },
    ];
    let tracker = Tracker::start(cluster.client.clone(), goals).await?;
    let replica = replicas
        .running
        .remove(&victim)
        .context("the victim runs")?;
    let killed = Instant::now();
    replica.kill().await?;
    Api::<ConfigMap>::namespaced(cluster.client.clone(), CONFIG_NAMESPACE)
        .patch(
            CONFIG_NAME,
            &PatchParams::default(),
            &Patch::Merge(config_map(percent)?),
        )
        .await?;
    let reached = tracker.wait().await.context("taking over")?;
    let after = |i: usize| reached.at[i].saturating_duration_since(killed);
    let takeover = Takeover {
        victim: victim.clone(),
        owned: owned.len(),
        labelled: after(0),
        reconciled: after(1),
        rest: after(2),
    };
    eprintln!("sharding bench: {takeover:?}");

    // Back to R replicas, each with its share, before the next kill.
    let back = Tracker::start(
        cluster.client.clone(),
        vec![Goal {
            percent: Some(percent),
            shards: Some(ids.to_vec()),
            scope: Scope::All(n),
            fair_shares: true,
        }],
    )
    .await?;
    let restarted = Instant::now();
    replicas.start(&victim)?;
    back.wait().await.context("the restarted replica's share")?;
    eprintln!(
        "sharding bench: {victim} restarted and owns its share again after {:.2?}",
        restarted.elapsed()
    );
    Ok(takeover)
}

/// The holder of the leader Lease (the replica running the sharders).
async fn leader(cluster: &Cluster) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), LEASE_NAMESPACE);
    Ok(leases
        .get_opt(LEADER_LEASE)
        .await?
        .and_then(|lease| lease.spec?.holder_identity))
}

fn config_map(percent: i64) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": CONFIG_NAME, "namespace": CONFIG_NAMESPACE},
        "data": {"resource-threshold-config": format!(
            r#"{{"clusterStrategy":{{"cpuSuppressThresholdPercent":{percent}}}}}"#
        )}
    }))?)
}
