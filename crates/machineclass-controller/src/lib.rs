//! `machineclass-controller`: Gardener machine-controller-manager's MachineClass finalizer loop
//! and the Machine lifecycle behind it, on `machine.sapcloud.io/v1alpha1`.
//!
//! Pipeline per reconcile: read caches -> validate -> decide (pure, in `machineclass-core`) ->
//! apply (minimal, guarded writes; nothing when nothing changed) -> status. Four controllers share
//! one process: MachineClass ([`class`]), Secret ([`secret`]), Machine ([`machine`],
//! [`deletion`]); Nodes are watched to trigger their Machines and are handled by the Machine
//! reconcile (finalizer, template sync, deletion). Provider calls go through a
//! [`machine_driver::Driver`]: the in-process simulator (`--driver sim`) or a gRPC provider
//! (`--driver grpc://host:port`).

pub mod class;
pub mod context;
pub mod deletion;
pub mod error;
pub mod io;
pub mod machine;
pub mod metrics;
pub mod secret;

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use capstan_apis::machine::{GoDuration, Machine, MachineClass, NODE_LABEL_MACHINE_NAME};
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::service::Service;
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::telemetry;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use machine_driver::Driver;
use machine_driver::grpc::GrpcDriver;
use machine_driver::sim::{SimConfig, SimDriver};
use machineclass_core::class::class_name_of;
use machineclass_core::driver_error::RetryPeriods;
use machineclass_core::index::RefIndex;
use machineclass_core::secret::referenced_secret_keys;
use machineclass_core::validate::MachineTimeouts;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::context::{Ctx, key, lock, split_key};
use crate::metrics::{McmMetrics, MeteredDriver};

/// Binary, service, Lease and tracer name.
pub const SERVICE_NAME: &str = "machineclass-controller";

fn parse_duration(text: &str) -> Result<Duration, String> {
    GoDuration::new(text).to_std().map_err(|e| e.to_string())
}

/// Guards MachineClasses with finalizers while Machines use them, and drives the Machine
/// lifecycle through a provider driver (Gardener machine-controller-manager compatible, API group
/// `machine.sapcloud.io/v1alpha1`). Every replica watches; only the elected leader writes.
#[derive(clap::Parser, Debug)]
#[command(name = "machineclass-controller", version, about = "Guards MachineClasses with finalizers while Machines use them, and drives the Machine lifecycle through a provider driver (Gardener machine-controller-manager compatible, API group machine.sapcloud.io/v1alpha1). Every replica watches; only the elected leader writes.", long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Namespace of the MachineClasses, Machines and their Secrets.
    #[arg(long, env = "MCM_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// Provider driver: `sim` (in-process simulated provider) or `grpc://host:port`.
    #[arg(long, env = "MACHINE_DRIVER", default_value = "sim")]
    pub driver: String,

    /// Simulated provider: time until a new VM's Node turns Ready (Go duration).
    #[arg(long, env = "SIM_READY_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub sim_ready_delay: Duration,

    /// Retry after a write conflict.
    #[arg(long, env = "CONFLICT_RETRY", default_value = "200ms", value_parser = parse_duration)]
    pub conflict_retry: Duration,
    /// Short retry (transient errors, waiting for a dependency).
    #[arg(long, env = "SHORT_RETRY", default_value = "5s", value_parser = parse_duration)]
    pub short_retry: Duration,
    /// Medium retry (non-transient driver errors).
    #[arg(long, env = "MEDIUM_RETRY", default_value = "3m", value_parser = parse_duration)]
    pub medium_retry: Duration,
    /// Long retry (periodic resync, invalid input).
    #[arg(long, env = "LONG_RETRY", default_value = "10m", value_parser = parse_duration)]
    pub long_retry: Duration,
    /// Retry after a `ResourceExhausted` driver error.
    #[arg(long, env = "RESOURCE_EXHAUSTED_RETRY", default_value = "3m", value_parser = parse_duration)]
    pub resource_exhausted_retry: Duration,

    /// Default `creationTimeout` of Machines that do not set one.
    #[arg(long, env = "MACHINE_CREATION_TIMEOUT", default_value = "20m", value_parser = parse_duration)]
    pub machine_creation_timeout: Duration,
    /// Default `healthTimeout` of Machines that do not set one.
    #[arg(long, env = "MACHINE_HEALTH_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub machine_health_timeout: Duration,
    /// Default `drainTimeout` of Machines that do not set one.
    #[arg(long, env = "MACHINE_DRAIN_TIMEOUT", default_value = "2h", value_parser = parse_duration)]
    pub machine_drain_timeout: Duration,

    /// Machines reconciled in parallel.
    #[arg(long, env = "MACHINE_CONCURRENCY", default_value_t = 10)]
    pub machine_concurrency: u16,
    /// MachineClasses and Secrets reconciled in parallel.
    #[arg(long, env = "CLASS_CONCURRENCY", default_value_t = 4)]
    pub class_concurrency: u16,
}

impl Args {
    pub fn machine_timeouts(&self) -> MachineTimeouts {
        MachineTimeouts {
            creation: self.machine_creation_timeout,
            health: self.machine_health_timeout,
            drain: self.machine_drain_timeout,
            disable_health_timeout: false,
        }
    }

    pub fn retry_periods(&self) -> RetryPeriods {
        RetryPeriods {
            conflict: self.conflict_retry,
            short: self.short_retry,
            medium: self.medium_retry,
            long: self.long_retry,
            resource_exhausted: self.resource_exhausted_retry,
        }
    }
}

/// Runs the binary and maps the outcome to the process exit code (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("machineclass-controller: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn build_driver(args: &Args, client: &Client) -> anyhow::Result<(Arc<dyn Driver>, &'static str)> {
    if args.driver == "sim" {
        let sim = SimDriver::new(
            client.clone(),
            SimConfig {
                namespace: args.namespace.clone(),
                ready_delay: args.sim_ready_delay,
            },
        );
        let resume = sim.clone();
        tokio::spawn(async move {
            match resume.resume().await {
                Ok(n) => tracing::info!(vms = n, "simulated provider resumed"),
                Err(err) => tracing::warn!(%err, "simulated provider could not resume its VMs"),
            }
        });
        return Ok((Arc::new(sim), "sim"));
    }
    let endpoint = GrpcDriver::endpoint_of(&args.driver).with_context(|| {
        format!(
            "--driver must be `sim` or `grpc://host:port`, got {:?}",
            args.driver
        )
    })?;
    Ok((Arc::new(GrpcDriver::connect_lazy(&endpoint)?), "grpc"))
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let telemetry = telemetry::init(SERVICE_NAME, &args.common)?;
    let shutdown = Shutdown::on_signals()?;
    let client = args
        .common
        .kube_client()
        .await
        .context("kubernetes client")?;
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry, SERVICE_NAME);
    let mcm_metrics = McmMetrics::register(&mut registry);
    let (inner_driver, provider) = build_driver(&args, &client)?;
    let driver: Arc<dyn Driver> = Arc::new(MeteredDriver::new(
        inner_driver,
        provider,
        mcm_metrics.clone(),
    ));
    let service = Service::start(
        SERVICE_NAME,
        &args.common,
        registry,
        Some(client.clone()),
        shutdown.clone(),
    )
    .await?;
    let wiring = Wiring {
        client,
        namespace: args.namespace.clone(),
        driver,
        retry: args.retry_periods(),
        timeouts: args.machine_timeouts(),
        metrics,
        mcm_metrics,
        leader: service.leader().clone(),
        shutdown: shutdown.clone(),
        machine_concurrency: args.machine_concurrency,
        class_concurrency: args.class_concurrency,
    };
    let readiness = service.readiness().clone();
    service
        .run(run_controllers(wiring, move || readiness.set_ready(true)))
        .await?;
    telemetry.shutdown().await;
    Ok(())
}

/// Everything [`run_controllers`] needs.
pub struct Wiring {
    pub client: Client,
    pub namespace: String,
    pub driver: Arc<dyn Driver>,
    pub retry: RetryPeriods,
    pub timeouts: MachineTimeouts,
    pub metrics: ControllerMetrics,
    pub mcm_metrics: McmMetrics,
    pub leader: capstan_runtime::leader::LeaderHandle,
    pub shutdown: Shutdown,
    pub machine_concurrency: u16,
    pub class_concurrency: u16,
}

type IndexFn<K> = fn(&K) -> BTreeSet<String>;

fn object_key<K: Resource>(obj: &K) -> String {
    key(
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default(),
    )
}

/// A reflector on `api` that also keeps `index` (object -> referenced keys) current and hands
/// the keys an event affects to `affected`. Yields the touched objects.
fn indexed_reflector<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    index: Arc<Mutex<RefIndex>>,
    refs_of: IndexFn<K>,
    affected: impl Fn(&str) + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let events = watcher(api, watcher::Config::default()).default_backoff();
    reflector::reflector(writer, events)
        .map_ok(move |event| {
            let touched = {
                let mut index = lock(&index);
                match &event {
                    watcher::Event::Init => {
                        index.begin_relist();
                        BTreeSet::new()
                    }
                    watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
                        index.upsert(&object_key(obj), refs_of(obj))
                    }
                    watcher::Event::Delete(obj) => index.remove(&object_key(obj)),
                    watcher::Event::InitDone => index.finish_relist(),
                }
            };
            for target in &touched {
                affected(target);
            }
            event
        })
        .touched_objects()
}

fn class_of(machine: &Machine) -> BTreeSet<String> {
    let ns = machine.metadata.namespace.as_deref().unwrap_or_default();
    class_name_of(machine)
        .map(|name| key(ns, name))
        .into_iter()
        .collect()
}

fn secrets_of(class: &MachineClass) -> BTreeSet<String> {
    referenced_secret_keys(class)
        .into_iter()
        .map(|(ns, name)| key(&ns, &name))
        .collect()
}

/// Yields once each time the watched flag (leadership, caches synced) turns true.
fn turned_true(rx: tokio::sync::watch::Receiver<bool>) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

fn send_ref<K: Resource<DynamicType = ()>>(tx: &UnboundedSender<ObjectRef<K>>, target: &str) {
    let (ns, name) = split_key(target);
    let _ = tx.send(ObjectRef::new(name).within(ns));
}

/// The four controllers for the whole process lifetime. They stop taking work when shutdown is
/// requested and return once in-flight reconciles are done. `on_ready` runs once every cache has
/// synced.
pub async fn run_controllers(w: Wiring, on_ready: impl FnOnce() + Send + 'static) {
    let ns = w.namespace.clone();
    let machines_api: Api<Machine> = Api::namespaced(w.client.clone(), &ns);
    let classes_api: Api<MachineClass> = Api::namespaced(w.client.clone(), &ns);
    let secrets_api: Api<Secret> = Api::namespaced(w.client.clone(), &ns);
    let nodes_api: Api<Node> = Api::all(w.client.clone());

    let (machine_store, machine_writer) = reflector::store();
    let (class_store, class_writer) = reflector::store();
    let (secret_store, secret_writer) = reflector::store();
    let (node_store, node_writer) = reflector::store();
    let (machine_tx, machine_rx) = unbounded_channel::<ObjectRef<Machine>>();
    let (class_tx, class_rx) = unbounded_channel::<ObjectRef<MachineClass>>();
    let (secret_tx, secret_rx) = unbounded_channel::<ObjectRef<Secret>>();
    let machine_index = Arc::new(Mutex::new(RefIndex::new()));
    let secret_index = Arc::new(Mutex::new(RefIndex::new()));
    let caches_ready = Arc::new(AtomicBool::new(false));
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);

    let reporter = Reporter {
        controller: SERVICE_NAME.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Ctx {
        client: w.client.clone(),
        namespace: ns.clone(),
        driver: w.driver,
        machines: machine_store.clone(),
        classes: class_store.clone(),
        nodes: node_store.clone(),
        secrets: secret_store.clone(),
        machine_index: machine_index.clone(),
        secret_index: secret_index.clone(),
        machine_triggers: machine_tx,
        class_triggers: class_tx.clone(),
        class_versions: Mutex::new(Default::default()),
        blocked_classes: Mutex::new(Default::default()),
        recorder: Recorder::new(w.client.clone(), reporter),
        retry: w.retry,
        timeouts: w.timeouts,
        metrics: w.metrics,
        leader: w.leader.clone(),
        caches_ready: caches_ready.clone(),
    });

    // Machine created, deleted or moved to another class -> its old and new class.
    let class_trigger = class_tx.clone();
    let machine_stream = indexed_reflector(
        machines_api,
        machine_writer,
        machine_index,
        class_of,
        move |class| send_ref(&class_trigger, class),
    );
    // Class references changed -> the Secrets it referred to and refers to now.
    let class_stream = indexed_reflector(
        classes_api,
        class_writer,
        secret_index,
        secrets_of,
        move |secret| send_ref(&secret_tx, secret),
    );
    let secret_stream = reflector::reflector(
        secret_writer,
        watcher(secrets_api, watcher::Config::default()).default_backoff(),
    )
    .touched_objects();
    let node_stream = reflector::reflector(
        node_writer,
        watcher(nodes_api, watcher::Config::default()).default_backoff(),
    )
    .touched_objects();

    let stop = |s: &Shutdown| {
        let token = s.token();
        async move { token.cancelled_owned().await }
    };
    let machine_config = ControllerConfig::default().concurrency(w.machine_concurrency);
    let class_config = ControllerConfig::default().concurrency(w.class_concurrency);

    let machine_ns = ns.clone();
    let machines = Controller::for_stream(machine_stream, machine_store.clone())
        .with_config(machine_config)
        .watches_stream(node_stream, move |node: Node| {
            node.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(NODE_LABEL_MACHINE_NAME))
                .map(|m| ObjectRef::new(m).within(&machine_ns))
        })
        .reconcile_on(UnboundedReceiverStream::new(machine_rx))
        .reconcile_all_on(futures::stream::select(
            turned_true(w.leader.subscribe()),
            turned_true(synced_rx.clone()),
        ))
        .graceful_shutdown_on(stop(&w.shutdown))
        .run(machine::reconcile, machine::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let classes = Controller::for_stream(class_stream, class_store.clone())
        .with_config(class_config.clone())
        .reconcile_on(UnboundedReceiverStream::new(class_rx))
        .reconcile_all_on(futures::stream::select(
            turned_true(w.leader.subscribe()),
            turned_true(synced_rx.clone()),
        ))
        .graceful_shutdown_on(stop(&w.shutdown))
        .run(class::reconcile, class::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let secrets = Controller::for_stream(secret_stream, secret_store.clone())
        .with_config(class_config)
        .reconcile_on(UnboundedReceiverStream::new(secret_rx))
        .reconcile_all_on(futures::stream::select(
            turned_true(w.leader.subscribe()),
            turned_true(synced_rx.clone()),
        ))
        .graceful_shutdown_on(stop(&w.shutdown))
        .run(secret::reconcile, secret::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));

    let mcm_metrics = w.mcm_metrics;
    let metrics_store = machine_store.clone();
    let readiness = async move {
        let synced = futures::future::try_join4(
            machine_store.wait_until_ready(),
            class_store.wait_until_ready(),
            secret_store.wait_until_ready(),
            node_store.wait_until_ready(),
        )
        .await;
        if synced.is_ok() {
            caches_ready.store(true, Ordering::Release);
            let _ = synced_tx.send(true);
            tracing::info!("caches synced");
            on_ready();
        }
        // Keep the machine gauges current from the cache.
        loop {
            mcm_metrics.refresh(&metrics_store);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    // kube-runtime's controllers wait for their cache before finishing, so a shutdown that comes
    // before every cache synced would hang; nothing can be in flight then (every reconcile holds
    // its writes until all caches are ready), so stop at once.
    let token = w.shutdown.token();
    let synced = ctx.caches_ready.clone();
    let early_shutdown = async move {
        token.cancelled().await;
        if synced.load(Ordering::Acquire) {
            futures::future::pending::<()>().await;
        }
    };
    // The readiness/metrics loop never ends; the controllers end after a shutdown request.
    tokio::select! {
        _ = futures::future::join3(machines, classes, secrets) => {}
        () = readiness => {}
        () = early_shutdown => tracing::info!("shutdown before the caches synced"),
    }
}
