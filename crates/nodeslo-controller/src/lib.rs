//! The `nodeslo-controller` binary: Koordinator's NodeSLO loop. It reads as flags ([`cli`]) ->
//! wiring (here) -> the controller ([`controller`]: [`watch`] feeds projections, [`reconcile`]
//! reads them, decides in `nodeslo-core` and writes, [`events`] reports bad input).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use capstan_apis::slo::NodeSlo;
use capstan_runtime::backoff::BackoffConfig;
use capstan_runtime::controller::Binary;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::sharding::{RingName, ShardMember, Sharder, SharderConfig, ShardingMetrics};
use capstan_runtime::shutdown::Shutdown;
use k8s_openapi::api::core::v1::Node;

pub mod cli;
pub mod controller;
pub mod events;
pub mod last_good;
pub mod metrics;
pub mod ownership;
pub mod projection;
pub mod reconcile;
pub mod watch;

pub use cli::Args;

/// Binary, service, Lease, field manager and tracer name.
pub const SERVICE_NAME: &str = "nodeslo-controller";

/// The sharding ring's name (`--shards auto`): label `shard.sharding.capstan.dev/nodeslo`,
/// Leases `nodeslo-<pod>`.
pub const RING: &str = "nodeslo";

/// Runs the binary and maps the outcome to the process exit code (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    capstan_runtime::controller::main_with(SERVICE_NAME, run(args)).await
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.shard_node_labels && !args.sharding.enabled() {
        anyhow::bail!("--shard-node-labels needs --shards auto");
    }
    args.sharding
        .check(&args.common.leader, "assigns nodes to shards")
        .map_err(anyhow::Error::msg)?;
    let mut binary = Binary::start(SERVICE_NAME, &args.common)?;
    let client = binary.kube_client().await?;
    let controller_metrics = ControllerMetrics::register(binary.registry(), SERVICE_NAME);
    let slo_metrics = metrics::SloMetrics::register(binary.registry());
    let sharded = if args.sharding.enabled() {
        let metrics = ShardingMetrics::register(binary.registry());
        let member = ShardMember::start(
            client.clone(),
            RingName::new(RING)?,
            &args.common.leader,
            binary.shutdown().clone(),
            Some(metrics.clone()),
        )
        .context("starting this replica's shard Lease")?;
        Some((member, metrics))
    } else {
        None
    };
    let settings = controller::Settings {
        config_namespace: args.config_namespace,
        config_name: args.config_name,
        workers: args.workers,
        conflict_retry: Duration::from_millis(args.conflict_retry_ms),
        manager: SERVICE_NAME.to_string(),
    };
    let controller = controller::NodeSloController::new(
        client.clone(),
        settings,
        slo_metrics,
        controller_metrics,
        BackoffConfig::default(),
        sharded.as_ref().map(|(member, _)| controller::Sharded {
            member: member.clone(),
            node_labels: args.shard_node_labels,
        }),
    );
    let shutdown = binary.shutdown().clone();
    let lease_namespace = args.common.leader.lease_namespace.clone();
    let node_labels = args.shard_node_labels;
    binary
        .serve(Some(client.clone()), |service| {
            let leader = service.leader().clone();
            let readiness = service.readiness().clone();
            async move {
                let Some((member, metrics)) = sharded else {
                    controller.run(readiness, leader, shutdown).await;
                    return Ok(());
                };
                let sharders = run_sharders(
                    &client,
                    &member,
                    &metrics,
                    &lease_namespace,
                    node_labels,
                    &leader,
                    &shutdown,
                );
                futures::future::join(
                    controller.run(readiness, leader.clone(), shutdown.clone()),
                    sharders,
                )
                .await;
                // The last reconcile is done: hand the share over at once.
                member
                    .lease()
                    .release()
                    .await
                    .context("releasing this replica's shard Lease")
                    .map(drop)
            }
        })
        .await??;
    Ok(())
}

/// The leader's sharders: NodeSLOs always, Nodes with `--shard-node-labels`; they end with the
/// leadership or at shutdown, and a failed one shuts the replica down.
async fn run_sharders(
    client: &kube::Client,
    member: &ShardMember,
    metrics: &ShardingMetrics,
    lease_namespace: &str,
    node_labels: bool,
    leader: &LeaderHandle,
    shutdown: &Shutdown,
) {
    let config = SharderConfig::new(member.ring().clone(), lease_namespace);
    let slos = Sharder::<NodeSlo>::new(client.clone(), config.clone())
        .with_metrics(metrics.clone())
        .run_while_leader(leader, shutdown);
    let nodes = async {
        if node_labels {
            Sharder::<Node>::new(client.clone(), config)
                .with_metrics(metrics.clone())
                .run_while_leader(leader, shutdown)
                .await
        } else {
            Ok(())
        }
    };
    let (slos, nodes) = futures::future::join(slos, nodes).await;
    for error in [slos.err(), nodes.err()].into_iter().flatten() {
        // A leader without its sharder would leave new and moved objects unassigned.
        tracing::error!(%error, "the sharder failed; shutting down so that another replica leads");
        shutdown.trigger();
    }
}
