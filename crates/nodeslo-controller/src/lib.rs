//! The `nodeslo-controller` binary: Koordinator's NodeSLO loop. It reads as flags ([`cli`]) ->
//! wiring (here) -> the controller ([`controller`]: [`watch`] feeds projections, [`reconcile`]
//! reads them, decides in `nodeslo-core` and writes, [`events`] reports bad input).

use std::process::ExitCode;
use std::time::Duration;

use capstan_runtime::backoff::BackoffConfig;
use capstan_runtime::controller::Binary;
use capstan_runtime::metrics::ControllerMetrics;

pub mod cli;
pub mod controller;
pub mod events;
pub mod last_good;
pub mod metrics;
pub mod projection;
pub mod reconcile;
pub mod watch;

pub use cli::Args;

/// Binary, service, Lease, field manager and tracer name.
pub const SERVICE_NAME: &str = "nodeslo-controller";

/// Runs the binary and maps the outcome to the process exit code (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    capstan_runtime::controller::main_with(SERVICE_NAME, run(args)).await
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut binary = Binary::start(SERVICE_NAME, &args.common)?;
    let client = binary.kube_client().await?;
    let controller_metrics = ControllerMetrics::register(binary.registry(), SERVICE_NAME);
    let slo_metrics = metrics::SloMetrics::register(binary.registry());
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
    );
    let shutdown = binary.shutdown().clone();
    binary
        .serve(Some(client), |service| {
            controller.run(
                service.readiness().clone(),
                service.leader().clone(),
                shutdown,
            )
        })
        .await?;
    Ok(())
}
