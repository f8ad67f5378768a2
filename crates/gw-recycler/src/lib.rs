//! Wiring of the `gw-recycler` binary; `main.rs` only parses flags and calls [`main_with`].
//! One process per worker cluster: it watches WorkerSliceGwRecyclers on the hub and plays the
//! server or client side of each ([`recycler`]), and reconciles the local SliceGateways'
//! deployments, pod status and router next hops ([`gateway`]). `gw-recycler trigger` starts a
//! recycle ([`trigger`]). The decisions live in `gw-recycler-core`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use capstan_apis::networking::DEFAULT_NAMESPACE;
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::service::Service;
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::telemetry;
use gw_recycler_core::Timestamp;
use gw_recycler_core::decide::Timing;
use kube::runtime::events::{Recorder, Reporter};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

pub mod error;
pub mod gateway;
pub mod metrics;
pub mod ops;
pub mod recycler;
pub mod sidecars;
pub mod template;
pub mod trigger;
pub mod world;

use crate::gateway::GatewayReconciler;
use crate::recycler::{Allowed, Recycler};
use crate::sidecars::Sidecars;
use crate::template::GatewayTemplate;
use crate::world::World;

/// Binary, service, Lease, field manager and tracer name.
pub const SERVICE_NAME: &str = "gw-recycler";

/// Which side of a gateway pair this instance may serve.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Role {
    /// Per recycle, from the local SliceGateway of the pair and its host type.
    #[default]
    Auto,
    /// Only orchestrate: own the state machine, write `spec.state` / `spec.request`.
    Server,
    /// Only perform the server's requests and write `status.client.response`.
    Client,
}

impl Role {
    /// The `controller` label of this instance's reconcile metrics.
    pub fn controller_name(self) -> &'static str {
        match self {
            Self::Auto => "gw-recycler",
            Self::Server => "gw-recycler-server",
            Self::Client => "gw-recycler-client",
        }
    }

    fn allowed(self) -> Allowed {
        match self {
            Self::Auto => Allowed::Auto,
            Self::Server => Allowed::Only(gw_recycler_core::role::Role::Server),
            Self::Client => Allowed::Only(gw_recycler_core::role::Role::Client),
        }
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    capstan_apis::duration::parse_go(text).map_err(|e| e.to_string())
}

/// Replaces slice gateway deployments make-before-break through a WorkerSliceGwRecycler state
/// machine on the hub cluster (KubeSlice worker-operator compatible), and reconciles the local
/// slice gateways' deployments, pod status and router next hops. Run one per worker cluster.
#[derive(clap::Parser, Debug)]
#[command(name = "gw-recycler", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Which side of a gateway pair this instance plays.
    #[arg(long, env = "GW_RECYCLER_ROLE", value_enum, default_value_t = Role::Auto)]
    pub role: Role,

    /// Kubeconfig of the hub cluster holding the WorkerSliceGwRecyclers.
    #[arg(long, env = "HUB_KUBECONFIG")]
    pub hub_kubeconfig: Option<PathBuf>,

    /// Project namespace on the hub.
    #[arg(long, env = "HUB_NAMESPACE")]
    pub hub_namespace: Option<String>,

    /// Namespace of the SliceGateways, gateway Deployments and router on this worker.
    #[arg(long, env = "GW_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,

    /// A waiting recycle step older than this fails into error_state (Go duration).
    #[arg(long, env = "STEP_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub step_timeout: Duration,

    /// Pause between moving the routes and removing the old gateway (Go duration).
    #[arg(long, env = "DRAIN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub drain_delay: Duration,

    /// How long a finished recycle is kept before it is deleted (Go duration).
    #[arg(long, env = "RETENTION", default_value = "1h", value_parser = parse_duration)]
    pub retention: Duration,

    /// Gateway instances per SliceGateway.
    #[arg(long, env = "GATEWAY_INSTANCES", default_value_t = 2)]
    pub gateway_instances: u32,

    /// Image of the gateway pods (runs `gw-sidecar`). Default: Capstan's image at this version.
    #[arg(long, env = "GATEWAY_IMAGE")]
    pub gateway_image: Option<String>,

    /// Extra `gw-sidecar` argument for the gateway pods (repeatable).
    #[arg(long = "gateway-arg", env = "GATEWAY_ARGS", value_delimiter = ' ')]
    pub gateway_args: Vec<String>,

    /// gRPC port of the router and gateway sidecars.
    #[arg(long, env = "SIDECAR_PORT", default_value_t = 5000)]
    pub sidecar_port: u16,

    /// Timeout of one sidecar call (Go duration).
    #[arg(long, env = "SIDECAR_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub sidecar_timeout: Duration,

    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Create a WorkerSliceGwRecycler on the hub (and optionally follow it).
    Trigger(trigger::TriggerArgs),
}

/// What the controllers of this binary are handed.
#[derive(Clone)]
pub struct Context {
    pub metrics: ControllerMetrics,
    /// Gate every write on `leader.is_leader()`.
    pub leader: LeaderHandle,
    /// Stop starting reconciles once `shutdown.token()` is cancelled.
    pub shutdown: Shutdown,
    pub world: World,
    pub wake: Arc<Notify>,
    pub recycler: Arc<Recycler>,
    pub gateways: Arc<GatewayReconciler>,
    pub readiness: capstan_runtime::admin::Readiness,
}

/// A client from a kubeconfig path (the same rules as `--kubeconfig`).
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let args = CommonArgs {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        ..CommonArgs::default()
    };
    Ok(args.kube_client().await?)
}

/// Runs the binary and maps the outcome to the process exit code (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    let result = match args.command {
        Some(Command::Trigger(trigger)) => trigger::run(trigger).await.map_err(anyhow::Error::from),
        None => run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gw-recycler: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let telemetry = telemetry::init(SERVICE_NAME, &args.common)?;
    let hub_kubeconfig = args
        .hub_kubeconfig
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--hub-kubeconfig is required"))?;
    let hub_namespace = args
        .hub_namespace
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--hub-namespace is required"))?;
    let shutdown = Shutdown::on_signals()?;
    let worker = args.common.kube_client().await?;
    let hub = client_for(&hub_kubeconfig).await?;
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry, args.role.controller_name());
    let recycler_metrics = metrics::RecyclerMetrics::register(&mut registry);
    let service = Service::start(
        SERVICE_NAME,
        &args.common,
        registry,
        Some(worker.clone()),
        shutdown.clone(),
    )
    .await?;
    let sidecars = Sidecars::new(args.sidecar_port, args.sidecar_timeout);
    let wake = Arc::new(Notify::new());
    let world = World::watch(&hub, &hub_namespace, &worker, &args.namespace, wake.clone());
    let reporter = Reporter {
        controller: SERVICE_NAME.to_owned(),
        instance: Some(args.common.leader.holder_identity()),
    };
    let recycler = Recycler {
        hub: hub.clone(),
        hub_namespace,
        worker: worker.clone(),
        namespace: args.namespace.clone(),
        allowed: args.role.allowed(),
        timing: Timing {
            step_timeout: args.step_timeout,
            drain_delay: args.drain_delay,
            retention: args.retention,
        },
        sidecars: sidecars.clone(),
        recorder: Recorder::new(hub, reporter),
        metrics: recycler_metrics,
        manager: SERVICE_NAME.to_owned(),
    };
    let gateways = GatewayReconciler::new(
        worker,
        args.namespace.clone(),
        args.gateway_instances,
        GatewayTemplate {
            image: args
                .gateway_image
                .clone()
                .unwrap_or_else(template::default_image),
            extra_args: args.gateway_args.clone(),
        },
        sidecars,
        SERVICE_NAME.to_owned(),
    );
    let context = Context {
        metrics,
        leader: service.leader().clone(),
        shutdown: shutdown.clone(),
        world,
        wake,
        recycler: Arc::new(recycler),
        gateways: Arc::new(gateways),
        readiness: service.readiness().clone(),
    };
    tracing::info!(role = ?args.role, "gw-recycler starting");
    service.run(run_controllers(context)).await?;
    telemetry.shutdown().await;
    Ok(())
}

/// Shortest and longest pause before re-probing a gRPC condition no watch event announces.
const PROBE_BACKOFF_MIN: Duration = Duration::from_millis(50);
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The reconcile loop for the process lifetime: a pass over every SliceGateway and recycler on
/// each watch event, and again after a short bounded backoff while a pass waits on a sidecar
/// condition (or at the time a time-based wait ends). Returns once shutdown is requested.
pub async fn run_controllers(context: Context) {
    tokio::select! {
        ready = context.world.ready() => {
            if let Err(error) = ready {
                tracing::error!(%error, "caches did not sync");
                return;
            }
        }
        () = context.shutdown.cancelled() => return,
    }
    context.readiness.set_ready(true);
    tracing::info!("gw-recycler ready");
    let mut backoff = PROBE_BACKOFF_MIN;
    let mut next: Option<Duration> = None;
    loop {
        let sleep = tokio::time::sleep(next.unwrap_or(Duration::from_secs(3600)));
        tokio::select! {
            () = context.wake.notified() => {}
            () = sleep, if next.is_some() => {}
            () = context.shutdown.cancelled() => return,
        }
        if !context.leader.is_leader() {
            // Nothing announces gaining the lease: look again shortly.
            next = Some(PROBE_BACKOFF_MAX);
            continue;
        }
        let (probe_again, progressed, recheck_after) = pass(&context).await;
        if progressed {
            backoff = PROBE_BACKOFF_MIN;
        }
        next = match (probe_again, recheck_after) {
            (true, later) => {
                let probe = backoff;
                backoff = (backoff * 2).min(PROBE_BACKOFF_MAX);
                Some(later.map_or(probe, |l| l.min(probe)))
            }
            (false, later) => {
                backoff = PROBE_BACKOFF_MIN;
                later
            }
        };
    }
}

/// One pass: gateways first (they create what recycles wait for), then every recycler.
async fn pass(context: &Context) -> (bool, bool, Option<Duration>) {
    let mut probe_again = false;
    let mut progressed = false;
    let mut recheck: Option<Duration> = None;
    for gateway in context.world.gateways.state() {
        let mut measure = context.metrics.measure("SliceGateway");
        match context.gateways.reconcile(&context.world, &gateway).await {
            Ok(pending) => probe_again |= pending.0,
            Err(error) => {
                tracing::warn!(%error, "slice gateway reconcile failed");
                measure.set_failure(&error);
                probe_again = true;
            }
        }
    }
    for cr in context.world.recyclers.state() {
        let mut measure = context.metrics.measure("WorkerSliceGwRecycler");
        match context
            .recycler
            .reconcile(&context.world, &cr, Timestamp::now())
            .await
        {
            Ok(outcome) => {
                probe_again |= outcome.probe_again;
                progressed |= outcome.progressed;
                if let Some(after) = outcome.recheck_after {
                    recheck = Some(recheck.map_or(after, |r| r.min(after)));
                }
            }
            Err(error) => {
                // A conflict means our cache was stale: the watch brings the fresh object.
                tracing::info!(%error, "recycler reconcile failed (retrying)");
                measure.set_failure(&error);
                probe_again = true;
            }
        }
    }
    (probe_again, progressed, recheck)
}
