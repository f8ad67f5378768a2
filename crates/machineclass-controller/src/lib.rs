//! `machineclass-controller`: Gardener machine-controller-manager's MachineClass finalizer loop
//! and the Machine lifecycle behind it, on `machine.sapcloud.io/v1alpha1`.
//!
//! Pipeline per reconcile: read caches -> validate -> decide (pure, in `machineclass-core`) ->
//! apply (minimal, guarded writes; nothing when nothing changed) -> status. The crate reads as
//! flags ([`cli`]) -> wiring (here) -> reconcile. Three controllers share one process:
//! MachineClass ([`class`]), Secret ([`secret`]), Machine ([`machine`], [`deletion`]), plus the
//! periodic orphan-VM sweep of MCM's safety controller ([`safety`]); Nodes are watched to trigger their Machines and are handled by the Machine
//! reconcile (finalizer, template sync, deletion). Provider calls go through a
//! [`machine_driver::Driver`]: the in-process simulator (`--driver sim`) or a gRPC provider
//! (`--driver grpc://host:port`).
//!
//! # Sharding (`--shards auto`)
//!
//! With `--shards off` (the default) one elected replica does all the work and the others stand
//! by; nothing below applies (no shard Lease, no sharder, no shard label read). With
//! `--shards auto` every replica owns a share of the Machines, on `capstan_runtime::sharding`
//! (design in `docs/sharding.md`, section "machineclass-controller"):
//!
//! - **Decision**: one ring, [`RING`] (`machineclass`), over the Machines of `--namespace`; the
//!   ring key is `namespace/name`. `--shards auto` needs `--leader-elect` (refused at start,
//!   naming both flags: [`cli::Args::check`]), and the election's identity (`--lease-identity`,
//!   `POD_NAME`) is the shard id: Lease `machineclass-<pod>` beside the leader Lease, same
//!   duration and grace.
//! - Each replica's Machine watch selects `shard.sharding.capstan.dev/machineclass=<pod>`, so it
//!   caches (and indexes) only its Machines. A Machine reconcile first asks the shard
//!   ([`context::Context::machine_gate`]): its own Machine is reconciled as unsharded; a drained
//!   one is released (both ring labels removed by a JSON patch guarded by a `test` of the shard
//!   label) and nothing else is done with it (the runner runs one reconcile per object at a
//!   time, so none runs on it meanwhile); anything else, and everything while the shard Lease is
//!   not held, is ignored (counted in `capstan_sharding_reconciles_refused_total`). The Machine
//!   runner is gated on the shard Lease, not on leadership.
//! - **Decision**: the cluster-wide work stays on the leader, gated on leadership as today: the
//!   MachineClass reconcile (finalizer add and remove, the blocked deletion and its
//!   `MachineClassInUse` Warning), the Secret reconcile and the orphan-VM sweep, plus the
//!   sharder. No replica caches every Machine, so a class decision that the leader's own share
//!   cannot settle (a local count of zero, or a deleting class, whose Warning names the count:
//!   `machineclass_core::class::needs_every_machine`) counts every Machine from a fresh LIST of
//!   the namespace in pages of [`context::LIST_PAGE`]; the sweep LISTs every Machine after
//!   listing the VMs. A blocked deletion is retried with the error backoff (from
//!   `--short-retry` doubling up to `--medium-retry`), each retry one LIST: no replica sees
//!   another shard's Machine go, so the class goes at the next retry after its last Machine,
//!   not at once.
//! - **Decision** (ours, not MCM's: MCM's `ValidateMachineClass` only enqueues the class and
//!   retries): the shard reconciling a Machine adds the MCM finalizer to a live class that lacks
//!   it (guarded by the class's resourceVersion, idempotent), so a class never goes without its
//!   finalizer while a Machine of any shard uses it; a class changed is fanned out to each
//!   replica's own Machines from its class watch (every replica caches all MachineClasses and
//!   Secrets, which the Machine reconcile reads).
//! - **Decision**: the Secret reconcile stays leader-only: its decision reads only which classes
//!   refer to a Secret, which every replica caches in full, so it needs no Machine at all, and
//!   one writer per Secret keeps today's single-writer finalizer updates.
//! - MCM's "another Machine of the deployment failed" (a deferred replacement) reads a fresh
//!   LIST by the deployment label when sharded, asked only for Machines in phase `Unknown`.
//! - Nodes carry no shard label and are not ours to label, so every replica still watches all
//!   Nodes; the cache keeps only what decisions read ([`node_cache::keep_what_decisions_read`]:
//!   metadata, taints, unschedulable, capacity, conditions). The simulated provider's VM cache
//!   is likewise whole on every replica.
//! - Shutdown: the runners stop taking work and finish what runs, then the shard Lease is
//!   released, so the sharder hands the share to the others at once; the leader Lease is
//!   released after that. Losing the shard Lease is fail-stop (it triggers shutdown, and the
//!   process exits non-zero).
//! - Metrics: `ShardingMetrics` registered once in the binary's registry (`capstan_sharding_*`),
//!   shared by the shard side and the sharder; the `mcm_machine_*` gauges, read from the Machine
//!   cache, cover each replica's own share (sum over the replicas).

pub mod class;
pub mod cli;
pub mod context;
pub mod deletion;
pub mod error;
pub mod io;
pub mod machine;
pub mod metrics;
pub mod node_cache;
pub mod safety;
pub mod secret;

use std::collections::BTreeSet;
use std::process::ExitCode;

pub use cli::Args;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use capstan_apis::machine::{Machine, MachineClass, NODE_LABEL_MACHINE_NAME};
use capstan_runtime::backoff::BackoffConfig;
use capstan_runtime::controller::{
    Binary, Gates, Reconciler, RetryPolicy, reflect, reflect_own_writes_trimmed, watch_events,
};
use capstan_runtime::events::EventPublisher;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::own_writes::{self, OwnWrites};
use capstan_runtime::runner::Runner;
use capstan_runtime::sharding::{RingName, ShardMember, Sharder, SharderConfig, ShardingMetrics};
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::sync::lock;
use futures::{Stream, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
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
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::context::{Context, error_policy, key, split_key};
use crate::metrics::{McmMetrics, MeteredDriver};

/// Binary, service, Lease and tracer name.
pub const SERVICE_NAME: &str = "machineclass-controller";

/// The ring of `--shards auto` (shard Leases `machineclass-<pod>`, label
/// `shard.sharding.capstan.dev/machineclass` on Machines).
pub const RING: &str = "machineclass";

/// Runs the binary and maps the outcome to the process exit code (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    capstan_runtime::controller::main_with(SERVICE_NAME, run(args)).await
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
    args.check().map_err(anyhow::Error::msg)?;
    let mut binary = Binary::start(SERVICE_NAME, &args.common)?;
    let client = binary.kube_client().await.context("kubernetes client")?;
    let metrics = ControllerMetrics::register(binary.registry(), SERVICE_NAME);
    let mcm_metrics = McmMetrics::register(binary.registry());
    let (inner_driver, provider) = build_driver(&args, &client)?;
    let driver: Arc<dyn Driver> = Arc::new(MeteredDriver::new(
        inner_driver,
        provider,
        mcm_metrics.clone(),
    ));
    let shutdown = binary.shutdown().clone();
    let sharding = if args.sharding.enabled() {
        // Registered once; the shard side and the sharder count into the same families.
        let sharding_metrics = ShardingMetrics::register(binary.registry());
        let member = ShardMember::start(
            client.clone(),
            ring()?,
            &args.common.leader,
            shutdown.clone(),
            Some(sharding_metrics.clone()),
        )
        .context("starting this replica's shard")?;
        tracing::info!(shard = %member.shard(), ring = %member.ring(), "sharded: reconciling this replica's share of the machines");
        Some(Sharding {
            member,
            metrics: sharding_metrics,
            lease_namespace: args.common.leader.lease_namespace.clone(),
        })
    } else {
        None
    };
    binary
        .serve(Some(client.clone()), |service| {
            let wiring = Wiring {
                client,
                namespace: args.namespace.clone(),
                driver,
                retry: args.retry_periods(),
                timeouts: args.machine_timeouts(),
                metrics,
                mcm_metrics,
                leader: service.leader().clone(),
                shutdown,
                machine_concurrency: args.machine_concurrency,
                class_concurrency: args.class_concurrency,
                orphan_vms_period: args.machine_safety_orphan_vms_period,
                sharding,
            };
            let readiness = service.readiness().clone();
            run_controllers(wiring, move || readiness.set_ready(true))
        })
        .await??;
    Ok(())
}

/// The ring of this controller's replicas: `machineclass`, over Machines.
pub fn ring() -> Result<RingName, capstan_runtime::sharding::ShardingError> {
    RingName::new(RING)
}

/// `--shards auto`: this replica's shard, the metric families of the ring, and where the shard
/// Leases live (the leader election's namespace).
pub struct Sharding {
    pub member: Arc<ShardMember>,
    pub metrics: ShardingMetrics,
    pub lease_namespace: String,
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
    /// Period of the orphan-VM sweep.
    pub orphan_vms_period: Duration,
    /// `Some` with `--shards auto`.
    pub sharding: Option<Sharding>,
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
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    index: Arc<Mutex<RefIndex>>,
    refs_of: IndexFn<K>,
    affected: impl Fn(&str) + Send + 'static,
    on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: capstan_runtime::controller::Watched,
{
    reflector::reflector(writer, watch_events(api, config))
        .map_ok(move |event| {
            on_event(&event);
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

fn send_ref<K: Resource<DynamicType = ()>>(tx: &UnboundedSender<ObjectRef<K>>, target: &str) {
    let (ns, name) = split_key(target);
    let _ = tx.send(ObjectRef::new(name).within(ns));
}

/// The three controllers (Machine, MachineClass, Secret) for the whole process lifetime, and
/// sharded the sharder. They stop taking work when shutdown is requested and return once
/// in-flight reconciles are done; sharded, the shard Lease is released after that, so the
/// sharder hands this replica's Machines to the others at once. `on_ready` runs once every cache
/// has synced. Errs when the shard Lease was lost while held (the process exits non-zero).
pub async fn run_controllers(
    w: Wiring,
    on_ready: impl FnOnce() + Send + 'static,
) -> anyhow::Result<()> {
    let ns = w.namespace.clone();
    let machines_api: Api<Machine> = Api::namespaced(w.client.clone(), &ns);
    let classes_api: Api<MachineClass> = Api::namespaced(w.client.clone(), &ns);
    let secrets_api: Api<Secret> = Api::namespaced(w.client.clone(), &ns);
    let nodes_api: Api<Node> = Api::all(w.client.clone());
    let member = w.sharding.as_ref().map(|sharding| sharding.member.clone());

    let (machine_store, machine_writer) = reflector::store();
    let (class_store, class_writer) = reflector::store();
    let (secret_store, secret_stream) = reflect(secrets_api, watcher::Config::default());
    let own_writes_ttl = own_writes::DEFAULT_TTL;
    let own_machines = Arc::new(OwnWrites::new(machine_store.clone(), own_writes_ttl));
    // Every replica needs the Nodes of its Machines, which carry no shard label: all Nodes are
    // watched, each trimmed to what the decisions read (`node_cache`).
    let (own_nodes, node_stream) = reflect_own_writes_trimmed(
        nodes_api,
        watcher::Config::default(),
        own_writes_ttl,
        node_cache::keep_what_decisions_read,
    );
    let node_store = own_nodes.store().clone();
    let (machine_tx, machine_rx) = unbounded_channel::<ObjectRef<Machine>>();
    let (class_tx, class_rx) = unbounded_channel::<ObjectRef<MachineClass>>();
    let (secret_tx, secret_rx) = unbounded_channel::<ObjectRef<Secret>>();
    let machine_index = Arc::new(Mutex::new(RefIndex::new()));
    let secret_index = Arc::new(Mutex::new(RefIndex::new()));
    let caches_ready = Arc::new(AtomicBool::new(false));
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);

    let retry = RetryPolicy {
        conflict: w.retry.conflict,
        // MCM retries a failed step after its short period; repeated failures back off up to
        // the medium period.
        backoff: BackoffConfig {
            base: w.retry.short,
            max: w.retry.medium.max(w.retry.short),
            factor: 2,
            jitter: false,
        },
    };
    let ctx = Arc::new(Context {
        client: w.client.clone(),
        namespace: ns.clone(),
        driver: w.driver,
        own_machines: own_machines.clone(),
        classes: class_store.clone(),
        own_nodes,
        secrets: secret_store.clone(),
        machine_index: machine_index.clone(),
        secret_index: secret_index.clone(),
        machine_triggers: machine_tx,
        class_triggers: class_tx.clone(),
        class_versions: Mutex::new(Default::default()),
        blocked_classes: Mutex::new(Default::default()),
        events: EventPublisher::new(w.client.clone(), SERVICE_NAME),
        retry: w.retry,
        timeouts: w.timeouts,
        reconciler: Reconciler::new(w.metrics, retry),
        leader: w.leader.clone(),
        shard: member.clone(),
        caches_ready: caches_ready.clone(),
    });

    // Sharded, this replica's Machines only: those labelled with its shard.
    let machine_watch = member
        .as_ref()
        .map_or_else(watcher::Config::default, |member| member.watcher_config());
    // Machine created, deleted or moved to another class -> its old and new class.
    let class_trigger = class_tx.clone();
    let machine_stream = indexed_reflector(
        machines_api,
        machine_watch,
        machine_writer,
        machine_index,
        class_of,
        move |class| send_ref(&class_trigger, class),
        move |event| own_machines.observe(event),
    );
    // Sharded, the class reconcile runs on the leader alone, so each replica re-validates its
    // own Machines against a changed class from the class watch.
    let fan_out = member.is_some().then(|| ctx.clone());
    // Class references changed -> the Secrets it referred to and refers to now.
    let class_stream = indexed_reflector(
        classes_api,
        watcher::Config::default(),
        class_writer,
        secret_index,
        secrets_of,
        move |secret| send_ref(&secret_tx, secret),
        move |event| {
            if let (Some(ctx), watcher::Event::Apply(class)) = (&fan_out, event) {
                ctx.enqueue_machines_of(&object_key(class));
            }
        },
    );

    // Cluster-wide work (classes, Secrets, the orphan sweep, the sharder) runs on the leader.
    let leader_gates = Gates {
        work_allowed: w.leader.subscribe(),
        caches_synced: synced_rx.clone(),
        shutdown: w.shutdown.clone(),
    };
    // Machines: on the leader unsharded, on every replica holding its shard Lease sharded.
    let machine_gates = Gates {
        work_allowed: member
            .as_ref()
            .map_or_else(|| w.leader.subscribe(), |member| member.lease().subscribe()),
        caches_synced: synced_rx,
        shutdown: w.shutdown.clone(),
    };
    let machine_ns = ns.clone();
    let machines = Runner::new(machine_store.clone())
        .gated(&machine_gates)
        .for_stream(machine_stream)
        .watches_stream(node_stream, move |node: Node| {
            node.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(NODE_LABEL_MACHINE_NAME))
                .map(|m| ObjectRef::new(m).within(&machine_ns))
        })
        .reconcile_on(UnboundedReceiverStream::new(machine_rx))
        .run(
            w.machine_concurrency.into(),
            machine::reconcile,
            error_policy,
            ctx.clone(),
        );
    let class_workers = w.class_concurrency.into();
    let classes = Runner::new(class_store.clone())
        .gated(&leader_gates)
        .for_stream(class_stream)
        .reconcile_on(UnboundedReceiverStream::new(class_rx))
        .run(class_workers, class::reconcile, error_policy, ctx.clone());
    let secrets = Runner::new(secret_store.clone())
        .gated(&leader_gates)
        .for_stream(secret_stream)
        .reconcile_on(UnboundedReceiverStream::new(secret_rx))
        .run(class_workers, secret::reconcile, error_policy, ctx.clone());
    let sharder = run_sharder(&w.client, &ns, w.sharding.as_ref(), &w.leader, &w.shutdown);

    let sweeps = safety::run_sweeps(ctx.clone(), w.orphan_vms_period, w.mcm_metrics.clone());
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
        // Keep the machine gauges current from the cache (sharded: this replica's share).
        loop {
            mcm_metrics.refresh(&metrics_store);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    };
    // The readiness/metrics loop never ends; the controllers and the sharder end after a
    // shutdown request.
    tokio::select! {
        _ = futures::future::join4(machines, classes, secrets, sharder) => {}
        () = readiness => {}
        () = sweeps => {}
        () = leader_gates.shutdown_before_sync() => tracing::info!("shutdown before the caches synced"),
    }
    // No reconcile runs any more: hand the share over (fail-stop if the Lease was lost).
    if let Some(member) = member {
        let end = member
            .lease()
            .release()
            .await
            .context("the shard lease was lost while held")?;
        tracing::info!(shard = %member.shard(), ?end, "shard lease released");
    }
    Ok(())
}

/// Sharded: the sharder of the ring `machineclass` over this namespace's Machines, while this
/// replica leads (every replica runs this; only the leader's shards). It ends at shutdown; if it
/// fails while leading, shutdown is triggered, so that another replica leads and shards.
async fn run_sharder(
    client: &Client,
    namespace: &str,
    sharding: Option<&Sharding>,
    leader: &capstan_runtime::leader::LeaderHandle,
    shutdown: &Shutdown,
) {
    let Some(sharding) = sharding else {
        return;
    };
    let config = SharderConfig::new(sharding.member.ring().clone(), &sharding.lease_namespace);
    let sharder = Sharder::<Machine>::new_in(client.clone(), config, namespace)
        .with_metrics(sharding.metrics.clone());
    if let Err(error) = sharder.run_while_leader(leader, shutdown).await {
        tracing::error!(%error, "the sharder failed; shutting down so that another replica leads");
        shutdown.trigger();
    }
}
