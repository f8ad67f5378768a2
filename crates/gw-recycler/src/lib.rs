//! Wiring of the `gw-recycler` binary; `main.rs` only parses flags ([`cli`]) and calls
//! [`main_with`]. One process per worker cluster, two controllers on the kit of
//! `capstan-runtime`, each a `runner::Runner` (its hand-offs are a recycle's critical path): the
//! slice gateway reconciler ([`gateway`], plus [`rebalance`]) over the worker's SliceGateways, and
//! the recycler ([`recycler`]) over the hub's WorkerSliceGwRecyclers, playing the server or
//! client side of each. `gw-recycler trigger` starts a recycle ([`trigger`]). The decisions live
//! in `gw-recycler-core`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use capstan_apis::networking::{LABEL_NODE_TYPE, LABEL_SLICEGW, NODE_TYPE_GATEWAY, SliceGateway};
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_runtime::backoff::BackoffConfig;
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::controller::{
    Binary, Gates, Reconciler, RetryPolicy, Target, reflect, reflect_own_writes,
};
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::own_writes;
use capstan_runtime::runner::{Next, Runner};
use capstan_runtime::shutdown::Shutdown;
use futures::TryStreamExt;
use gw_recycler_core::Timestamp;
use gw_recycler_core::decide::Timing;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource};
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;

pub mod cli;
pub mod error;
pub mod gateway;
pub mod metrics;
pub mod ops;
pub mod probe;
pub mod rebalance;
pub mod recycler;
pub mod relevant;
pub mod sidecars;
pub mod template;
pub mod trigger;
pub mod world;

pub use cli::{Args, Command, Role};

use crate::error::ReconcileError;
use crate::gateway::GatewayReconciler;
use crate::probe::{ProbeLadder, Rungs};
use crate::recycler::Recycler;
use crate::relevant::relevant_only;
use crate::sidecars::Sidecars;
use crate::template::GatewayTemplate;
use crate::world::{World, gateway_deployments, label};

/// Binary, service, Lease, field manager and tracer name.
pub const SERVICE_NAME: &str = "gw-recycler";

/// A client from a kubeconfig path (the same rules as `--kubeconfig`).
pub async fn client_for(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let args = CommonArgs {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        ..CommonArgs::default()
    };
    Ok(args.kube_client_for(SERVICE_NAME).await?)
}

/// Runs the binary (or its `trigger` subcommand) and maps the outcome to the process exit code
/// (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    use capstan_runtime::controller::main_with;
    match args.command {
        Some(Command::Trigger(trigger)) => main_with(SERVICE_NAME, trigger::run(trigger)).await,
        None => main_with(SERVICE_NAME, run(args)).await,
    }
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut binary = Binary::start(SERVICE_NAME, &args.common)?;
    let hub_kubeconfig = args
        .hub_kubeconfig
        .clone()
        .context("--hub-kubeconfig is required")?;
    let hub_namespace = args
        .hub_namespace
        .clone()
        .filter(|n| !n.is_empty())
        .context("--hub-namespace is required")?;
    let worker = binary
        .kube_client()
        .await
        .context("worker kubernetes client")?;
    let hub = client_for(&hub_kubeconfig)
        .await
        .context("hub kubernetes client")?;
    let metrics = ControllerMetrics::register(binary.registry(), args.role.controller_name());
    let recycler_metrics = metrics::RecyclerMetrics::register(binary.registry());
    let sidecars = Sidecars::new(args.sidecar_port, args.sidecar_timeout);
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
        recorder: Recorder::new(hub.clone(), reporter),
        metrics: recycler_metrics,
        manager: SERVICE_NAME.to_owned(),
    };
    let gateways = GatewayReconciler::new(
        worker.clone(),
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
        args.status_interval,
    );
    tracing::info!(role = ?args.role, rebalance = args.rebalance, "gw-recycler starting");
    let shutdown = binary.shutdown().clone();
    binary
        .serve(Some(worker.clone()), |service| {
            let wiring = Wiring {
                hub,
                worker,
                namespace: args.namespace.clone(),
                recycler,
                gateways,
                rebalance: args.rebalance,
                metrics,
                leader: service.leader().clone(),
                shutdown,
            };
            let readiness = service.readiness().clone();
            run_controllers(wiring, move || readiness.set_ready(true))
        })
        .await?;
    Ok(())
}

/// Everything [`run_controllers`] needs.
pub struct Wiring {
    pub hub: kube::Client,
    pub worker: kube::Client,
    /// Namespace of the SliceGateways, gateway Deployments and router on the worker.
    pub namespace: String,
    pub recycler: Recycler,
    pub gateways: GatewayReconciler,
    /// Trigger recycles of gateways crowded on one node (`--rebalance`).
    pub rebalance: bool,
    pub metrics: ControllerMetrics,
    pub leader: LeaderHandle,
    pub shutdown: Shutdown,
}

/// What both controllers' reconciles are handed.
pub struct Context {
    pub world: World,
    pub recycler: Recycler,
    pub gateways: GatewayReconciler,
    pub rebalance: bool,
    /// Spans, metrics and error retries of every reconcile (kind = SliceGateway or
    /// WorkerSliceGwRecycler).
    pub reconciler: Reconciler,
    /// Per object: when to re-probe a gRPC condition no watch event announces.
    pub probes: ProbeLadder,
    /// Reconciles the recycles of these SliceGateways now: the gateway reconciler changed
    /// something of theirs that no watch event announces (the router's next hops).
    pub wake_recycles: Box<dyn Fn(Vec<String>) + Send + Sync>,
    /// Reconciles this SliceGateway now: a recycle changed what it acts on (the intermediate
    /// list, a marked deployment, an excluded pod).
    pub wake_gateway: Box<dyn Fn(&str) + Send + Sync>,
    pub leader: LeaderHandle,
    pub caches_ready: Arc<AtomicBool>,
}

/// Re-probing a gRPC condition: every 2 ms for the first 32 ms of a wait, then 64 ms, 128 ms,
/// ... after it began, then every second ([`probe::ProbeLadder`]). A new gateway's sidecar binds
/// its port a few milliseconds after its pod turns Running; a connection refused costs
/// microseconds, so the first re-checks come often and the steady rate is still one per second.
pub const PROBE_RUNGS: Rungs = Rungs {
    base: Duration::from_millis(2),
    dense: Duration::from_millis(32),
    max: Duration::from_secs(1),
};

/// What the gateway reconciler waits for when a gateway pod's sidecar is not ready yet.
const SIDECAR_READY: &str = "gateway_sidecar_ready";

/// Objects each controller reconciles at once (one reconcile per object at a time): a
/// reconcile mostly waits on API or gRPC round trips, and 20 recycles at once touch 20 recycles
/// and 20 gateways per process.
const WORKERS: usize = 32;

/// Retries of failed reconciles: a conflict soon (the watch brings the newer object), anything
/// else (API or sidecar errors) backing off per object from 100 ms to 2 s, since a recycle is
/// waiting on it.
pub const RETRY: RetryPolicy = RetryPolicy {
    conflict: Duration::from_millis(50),
    backoff: BackoffConfig {
        base: Duration::from_millis(100),
        max: Duration::from_secs(2),
        factor: 2,
        jitter: false,
    },
};

impl Context {
    /// `Some(park)` while this replica must not write: caches not yet synced, or not the leader
    /// (the kit reconciles everything again when either turns true).
    fn hold_writes(&self) -> Option<Next> {
        let writable = self.caches_ready.load(Ordering::Acquire) && self.leader.is_leader();
        (!writable).then_some(Next::AwaitChange)
    }

    /// When to look at `target` again: at the next rung of its probe ladder while it waits on a
    /// gRPC condition (`probing`), at `recheck_after` for a time-based wait or after work
    /// (whichever is first), else on the next watch event. Progress (or no probing) ends the wait.
    fn next_check(
        &self,
        target: Target<'_>,
        probing: Option<&'static str>,
        recheck_after: Option<Duration>,
        progressed: bool,
    ) -> Next {
        let key = format!(
            "{}/{}/{}",
            target.kind,
            target.namespace.unwrap_or_default(),
            target.name
        );
        if progressed || probing.is_none() {
            self.probes.reset(&key);
        }
        let probe = probing.map(|on| self.probes.next_delay(&key, on, Instant::now()));
        match probe.into_iter().chain(recheck_after).min() {
            Some(after) => Next::Requeue(after),
            None => Next::AwaitChange,
        }
    }
}

async fn reconcile_gateway(
    gateway: Arc<SliceGateway>,
    ctx: Arc<Context>,
) -> Result<Next, ReconcileError> {
    let gateway = ctx.world.gateways.freshest(gateway);
    let target = Target::of("SliceGateway", &*gateway);
    ctx.reconciler
        .reconcile(target, async {
            if let Some(hold) = ctx.hold_writes() {
                return Ok(hold);
            }
            let wake = || {
                if let Some(name) = &gateway.metadata.name {
                    (ctx.wake_recycles)(vec![name.clone()]);
                }
            };
            let pass = ctx.gateways.reconcile(&ctx.world, &gateway, wake).await?;
            if ctx.rebalance {
                rebalance::reconcile(&ctx.world, &ctx.recycler, &gateway).await?;
            }
            let probing = pass.unready.then_some(SIDECAR_READY);
            Ok(ctx.next_check(target, probing, pass.recheck_after, false))
        })
        .await
}

async fn reconcile_recycler(
    cr: Arc<WorkerSliceGwRecycler>,
    ctx: Arc<Context>,
) -> Result<Next, ReconcileError> {
    let cr = ctx.world.recyclers.freshest(cr);
    let target = Target::of("WorkerSliceGwRecycler", &*cr);
    ctx.reconciler
        .reconcile(target, async {
            if let Some(hold) = ctx.hold_writes() {
                return Ok(hold);
            }
            let outcome = ctx
                .recycler
                .reconcile(&ctx.world, &cr, Timestamp::now())
                .await?;
            if let Some(gateway) = &outcome.worked_on {
                (ctx.wake_gateway)(gateway);
            }
            Ok(ctx.next_check(
                target,
                outcome.probing,
                outcome.recheck_after,
                outcome.progressed,
            ))
        })
        .await
}

fn error_policy<K: Resource<DynamicType = ()>>(
    object: Arc<K>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Next {
    ctx.reconciler.next_after_error(&*object, error)
}

/// The two controllers for the process lifetime: SliceGateways on the worker (their gateway
/// Deployments and Pods, the slice router pod and, with rebalancing, Nodes map to them), and
/// WorkerSliceGwRecyclers on the hub (worker SliceGateways, Deployments and Pods map to the
/// recycles naming their gateway, through a trigger channel: the hub and the worker are different
/// clients, so these are reflector streams of their own). They stop taking work on shutdown and
/// return once in-flight reconciles are done; `on_ready` runs once every cache has synced.
pub async fn run_controllers(w: Wiring, on_ready: impl FnOnce() + Send + 'static) {
    let ns = w.namespace.clone();
    let hub_ns = w.recycler.hub_namespace.clone();
    let (recyclers, recycler_stream) = reflect_own_writes(
        Api::namespaced(w.hub.clone(), &hub_ns),
        watcher::Config::default(),
        own_writes::DEFAULT_TTL,
    );
    let (gateways, gateway_stream) = reflect_own_writes(
        Api::<SliceGateway>::namespaced(w.worker.clone(), &ns),
        watcher::Config::default(),
        own_writes::DEFAULT_TTL,
    );
    let (deployments, deployment_stream) = reflect_own_writes(
        Api::<Deployment>::namespaced(w.worker.clone(), &ns),
        gateway_deployments(),
        own_writes::DEFAULT_TTL,
    );
    let (pods, pod_stream) = reflect_own_writes(
        Api::<Pod>::namespaced(w.worker.clone(), &ns),
        watcher::Config::default(),
        own_writes::DEFAULT_TTL,
    );
    let gateway_nodes =
        watcher::Config::default().labels(&format!("{LABEL_NODE_TYPE}={NODE_TYPE_GATEWAY}"));
    let (nodes, node_stream) = reflect(Api::<Node>::all(w.worker.clone()), gateway_nodes);
    let world = World {
        namespace: ns.clone(),
        recyclers: recyclers.clone(),
        gateways: gateways.clone(),
        deployments,
        pods,
        nodes: w.rebalance.then_some(nodes),
    };
    let caches_ready = Arc::new(AtomicBool::new(false));
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);

    // Worker changes -> the recycles naming the gateway they concern.
    let (recycler_tx, recycler_rx) = unbounded_channel::<ObjectRef<WorkerSliceGwRecycler>>();
    let to_recyclers = {
        let world = world.clone();
        move |gateways: Vec<String>| {
            for cr in world.recyclers_of(&gateways) {
                let _ = recycler_tx.send(cr);
            }
        }
    };
    // The recycler's writes on the worker -> the gateway they concern, reconciled at once: it
    // sees those writes through the stand-ins, without waiting for their watch events.
    let (gateway_tx, gateway_rx) = unbounded_channel::<ObjectRef<SliceGateway>>();
    let to_gateway = {
        let ns = ns.clone();
        move |gateway: &str| {
            let _ = gateway_tx.send(ObjectRef::new(gateway).within(&ns));
        }
    };
    let ctx = Arc::new(Context {
        world: world.clone(),
        recycler: w.recycler,
        gateways: w.gateways,
        rebalance: w.rebalance,
        reconciler: Reconciler::new(w.metrics, RETRY),
        probes: ProbeLadder::new(PROBE_RUNGS),
        wake_recycles: Box::new(to_recyclers.clone()),
        wake_gateway: Box::new(to_gateway),
        leader: w.leader.clone(),
        caches_ready: caches_ready.clone(),
    });
    let (gw_changed, dep_changed, pod_changed) =
        (to_recyclers.clone(), to_recyclers.clone(), to_recyclers);
    // Only the Deployment and Pod events that change what a decision reads start passes.
    let deployment_stream = relevant_only(deployment_stream, world.deployments.store().clone());
    let pod_stream = relevant_only(pod_stream, world.pods.store().clone());
    let gateway_stream = gateway_stream.inspect_ok(move |g: &SliceGateway| {
        gw_changed(g.metadata.name.clone().into_iter().collect());
    });
    let deployment_stream = deployment_stream.inspect_ok(move |d: &Deployment| {
        dep_changed(
            label(d, LABEL_SLICEGW)
                .map(str::to_owned)
                .into_iter()
                .collect(),
        );
    });
    let pods_world = world.clone();
    let pod_stream =
        pod_stream.inspect_ok(move |p: &Pod| pod_changed(pods_world.gateways_of_pod(p)));

    let gates = Gates {
        work_allowed: w.leader.subscribe(),
        caches_synced: synced_rx,
        shutdown: w.shutdown.clone(),
    };
    let gateway_ref = {
        let ns = ns.clone();
        move |name: &str| ObjectRef::<SliceGateway>::new(name).within(&ns)
    };
    let dep_ref = gateway_ref.clone();
    let pod_ref = gateway_ref.clone();
    let pod_world = world.clone();
    let mut gateway_controller = Runner::new(gateways.store().clone())
        .gated(&gates)
        .for_stream(gateway_stream)
        .reconcile_on(UnboundedReceiverStream::new(gateway_rx))
        .watches_stream(deployment_stream, move |d: Deployment| {
            label(&d, LABEL_SLICEGW).map(&dep_ref)
        })
        .watches_stream(pod_stream, move |p: Pod| {
            pod_world
                .gateways_of_pod(&p)
                .into_iter()
                .map(|g| pod_ref(&g))
                .collect::<Vec<_>>()
        });
    if w.rebalance {
        // A gateway node added, removed or relabelled changes every gateway's share.
        let all = gateways.clone();
        gateway_controller = gateway_controller.watches_stream(node_stream, move |_: Node| {
            all.state()
                .iter()
                .map(|g| ObjectRef::from_obj(g.as_ref()))
                .collect::<Vec<_>>()
        });
    }
    let gateway_controller =
        gateway_controller.run(WORKERS, reconcile_gateway, error_policy, ctx.clone());
    let recycler_controller = Runner::new(recyclers.store().clone())
        .gated(&gates)
        .for_stream(recycler_stream)
        .reconcile_on(UnboundedReceiverStream::new(recycler_rx))
        .run(WORKERS, reconcile_recycler, error_policy, ctx.clone());

    let sync = async move {
        match world.ready().await {
            Ok(()) => {
                caches_ready.store(true, Ordering::Release);
                let _ = synced_tx.send(true);
                tracing::info!("gw-recycler ready");
                on_ready();
            }
            Err(error) => tracing::error!(%error, "caches did not sync"),
        }
        futures::future::pending::<()>().await;
    };
    tokio::select! {
        _ = futures::future::join(gateway_controller, recycler_controller) => {}
        () = sync => {}
        () = gates.shutdown_before_sync() => tracing::info!("shutdown before the caches synced"),
    }
}
