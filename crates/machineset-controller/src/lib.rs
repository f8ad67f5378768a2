//! `machineset-controller`: Gardener machine-controller-manager's MachineSet and
//! MachineDeployment controllers, on `machine.sapcloud.io/v1alpha1`.
//!
//! A MachineDeployment owns one MachineSet per template revision and rolls Machines from the old
//! sets to the new one ([`deployment`]); a MachineSet keeps its Machines at its replicas
//! ([`set`]). The Machines themselves (VMs, Nodes, drain) are machineclass-controller's: the two
//! binaries meet only in the API, as MCM's machine-controller-manager and its provider
//! machine-controller do, and each is scaled and elected on its own. The decisions are
//! `machineset-core`'s; the facts they follow are in `docs/machineset.md`. The overshooting
//! freeze of MCM's safety controller runs here too ([`safety`]); its orphan-VM sweep needs the
//! driver and runs in machineclass-controller.

pub mod cli;
pub mod context;
pub mod deployment;
pub mod error;
pub mod metrics;
pub mod safety;
pub mod set;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use capstan_apis::machine::{Machine, MachineDeployment, MachineSet};
use capstan_runtime::backoff::BackoffConfig;
use capstan_runtime::controller::{Binary, Gates, Reconciler, RetryPolicy, reflect_own_writes};
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::runner::{Next, Runner, Settle};
use capstan_runtime::shutdown::Shutdown;
pub use cli::Args;
use futures::StreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use machineset_core::ownership::controller_of;
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::context::Context;
use crate::metrics::SetMetrics;

/// How long this process's creates, deletes and writes stand in for what the watch has not
/// brought yet. MCM's expectations wait 5 minutes; with the 2 s a controller of single objects
/// uses, a watch lagging under load (1,000 Machines on 2 cores) let a create's stand-in expire
/// before its event: the set counted one Machine too few and created another, and a delete's
/// tombstone expired, so a Machine already deleted counted as live and another was deleted. The
/// watch delivers every version in order and a relist clears stand-ins, so a long one is only
/// ever replaced by its own event.
pub const EXPECTATIONS_TTL: Duration = Duration::from_secs(5 * 60);

/// Binary, service, Lease and tracer name.
pub const SERVICE_NAME: &str = "machineset-controller";

/// Runs the binary and maps the outcome to the process exit code (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    capstan_runtime::controller::main_with(SERVICE_NAME, run(args)).await
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut binary = Binary::start(SERVICE_NAME, &args.common)?;
    let client = binary.kube_client().await.context("kubernetes client")?;
    let metrics = ControllerMetrics::register(binary.registry(), SERVICE_NAME);
    let set_metrics = SetMetrics::register(binary.registry());
    let shutdown = binary.shutdown().clone();
    binary
        .serve(Some(client.clone()), |service| {
            let wiring = Wiring {
                client,
                namespace: args.namespace.clone(),
                metrics,
                set_metrics,
                leader: service.leader().clone(),
                shutdown,
                set_concurrency: args.set_concurrency,
                deployment_concurrency: args.deployment_concurrency,
                retry: RetryPolicy {
                    conflict: args.conflict_retry,
                    backoff: BackoffConfig {
                        base: args.short_retry,
                        max: args.short_retry * 10,
                        factor: 2,
                        jitter: false,
                    },
                },
                resync: args.resync,
                settle_window: args.settle_window,
                status_batch_window: args.status_batch_window,
                safety: safety::SafetyConfig {
                    period: args.machine_safety_overshooting_period,
                    up: args.safety_up,
                    down: args.safety_down,
                },
            };
            let readiness = service.readiness().clone();
            run_controllers(wiring, move || readiness.set_ready(true))
        })
        .await?;
    Ok(())
}

/// Everything [`run_controllers`] needs.
pub struct Wiring {
    pub client: Client,
    pub namespace: String,
    pub metrics: ControllerMetrics,
    pub set_metrics: SetMetrics,
    pub leader: capstan_runtime::leader::LeaderHandle,
    pub shutdown: Shutdown,
    pub set_concurrency: u16,
    pub deployment_concurrency: u16,
    pub retry: RetryPolicy,
    pub resync: Duration,
    /// See [`Args::settle_window`].
    pub settle_window: Duration,
    /// See [`Args::status_batch_window`].
    pub status_batch_window: Duration,
    pub safety: safety::SafetyConfig,
}

fn error_policy<K: Resource<DynamicType = ()>>(
    object: Arc<K>,
    error: &error::Error,
    ctx: Arc<Context>,
) -> Next {
    ctx.reconciler.next_after_error(&*object, error)
}

/// The MachineSet and MachineDeployment controllers for the whole process lifetime. They stop
/// taking work when shutdown is requested and return once in-flight reconciles are done.
/// `on_ready` runs once every cache has synced.
pub async fn run_controllers(w: Wiring, on_ready: impl FnOnce() + Send + 'static) {
    let ns = w.namespace.clone();
    let ttl = EXPECTATIONS_TTL;
    let (machines, machine_stream) = reflect_own_writes(
        Api::<Machine>::namespaced(w.client.clone(), &ns),
        watcher::Config::default(),
        ttl,
    );
    let (sets, set_stream) = reflect_own_writes(
        Api::<MachineSet>::namespaced(w.client.clone(), &ns),
        watcher::Config::default(),
        ttl,
    );
    let (deployments, deployment_stream) = reflect_own_writes(
        Api::<MachineDeployment>::namespaced(w.client.clone(), &ns),
        watcher::Config::default(),
        ttl,
    );
    let (deployment_tx, deployment_rx) = unbounded_channel::<ObjectRef<MachineDeployment>>();
    let caches_ready = Arc::new(AtomicBool::new(false));
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context::new(
        w.client.clone(),
        ns.clone(),
        machines.clone(),
        sets.clone(),
        deployments.clone(),
        deployment_tx,
        Reconciler::new(w.metrics, w.retry),
        w.set_metrics.clone(),
        w.leader.clone(),
        caches_ready.clone(),
        w.resync,
        w.status_batch_window,
    ));
    let gates = Gates {
        work_allowed: w.leader.subscribe(),
        caches_synced: synced_rx,
        shutdown: w.shutdown.clone(),
    };

    // Changes of other kinds (Machines for a set; sets and Machines for a deployment) come in
    // bursts during a roll: each is recounted once per settle window, not once per change.
    let settle = if w.settle_window.is_zero() {
        Settle::Now
    } else {
        Settle::Within(w.settle_window)
    };
    // A Machine wakes the set that controls it (and that set's deployment, which counts its
    // Machines); an orphan wakes every set, which may adopt it.
    let machine_sets = sets.clone();
    let machine_ctx = ctx.clone();
    let machine_ns = ns.clone();
    let set_runner = Runner::new(sets.store().clone())
        .gated(&gates)
        .for_stream(set_stream.inspect({
            let ctx = ctx.clone();
            move |set| {
                if let Ok(set) = set {
                    ctx.wake_owner_of(set);
                }
            }
        }))
        .watches_stream_settled(
            machine_stream,
            move |machine: Machine| {
                let targets: Vec<ObjectRef<MachineSet>> = match controller_of(&machine.metadata) {
                    Some(owner) if owner.kind == "MachineSet" => {
                        vec![ObjectRef::new(&owner.name).within(&machine_ns)]
                    }
                    Some(_) => vec![],
                    None => machine_sets
                        .store()
                        .state()
                        .iter()
                        .map(|s| ObjectRef::from_obj(&**s))
                        .collect(),
                };
                for target in &targets {
                    if let Some(set) = machine_sets.get(target) {
                        machine_ctx.wake_owner_of(&set);
                    }
                }
                targets
            },
            settle,
        )
        .run(
            w.set_concurrency.into(),
            set::reconcile,
            error_policy,
            ctx.clone(),
        );
    let deployment_runner = Runner::new(deployments.store().clone())
        .gated(&gates)
        .for_stream(deployment_stream)
        .reconcile_settled_on(UnboundedReceiverStream::new(deployment_rx), settle)
        .run(
            w.deployment_concurrency.into(),
            deployment::reconcile,
            error_policy,
            ctx.clone(),
        );

    let safety_passes = safety::run_passes(ctx.clone(), w.safety);
    let metrics = w.set_metrics;
    let readiness = async move {
        let synced = futures::future::try_join3(
            machines.store().wait_until_ready(),
            sets.store().wait_until_ready(),
            deployments.store().wait_until_ready(),
        )
        .await;
        if synced.is_ok() {
            caches_ready.store(true, Ordering::Release);
            let _ = synced_tx.send(true);
            tracing::info!("caches synced");
            on_ready();
        }
        loop {
            metrics.refresh(&sets, &deployments);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    tokio::select! {
        _ = futures::future::join(set_runner, deployment_runner) => {}
        () = readiness => {}
        () = safety_passes => {}
        () = gates.shutdown_before_sync() => tracing::info!("shutdown before the caches synced"),
    }
}
