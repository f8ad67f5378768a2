//! The `nodeslo-controller` binary: Koordinator's NodeSLO loop. `main.rs` only parses flags and
//! calls [`main_with`]; [`controller`] holds the loop, `nodeslo-core` the pure decisions.

use std::process::ExitCode;
use std::time::Duration;

use capstan_apis::slo::{CONFIG_NAME, CONFIG_NAMESPACE};
use capstan_runtime::backoff::PerObjectBackoff;
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::service::Service;
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::telemetry;
use prometheus_client::registry::Registry;

pub mod controller;
pub mod last_good;
pub mod metrics;
pub mod projection;

/// Binary, service, Lease, field manager and tracer name.
pub const SERVICE_NAME: &str = "nodeslo-controller";

/// Keeps exactly one NodeSLO per Node, its spec computed from the cluster SLO ConfigMap
/// (`koordinator-system/slo-controller-config`) and per-node selectors (Koordinator slo-controller
/// compatible, API group `slo.koordinator.sh/v1alpha1`). Every replica watches; only the elected
/// leader writes.
#[derive(clap::Parser, Debug)]
#[command(name = "nodeslo-controller", version, about, long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Namespace of the SLO ConfigMap.
    #[arg(long, env = "SLO_CONFIG_NAMESPACE", default_value = CONFIG_NAMESPACE)]
    pub config_namespace: String,
    /// Name of the SLO ConfigMap.
    #[arg(long, env = "SLO_CONFIG_NAME", default_value = CONFIG_NAME)]
    pub config_name: String,
    /// Reconciles running at once.
    #[arg(long, env = "NODESLO_WORKERS", default_value_t = 8)]
    pub workers: usize,
    /// Retry delay after a write conflict (the cache was stale), in milliseconds.
    #[arg(long, env = "NODESLO_CONFLICT_RETRY_MS", default_value_t = 200)]
    pub conflict_retry_ms: u64,
}

/// Runs the binary and maps the outcome to the process exit code (0 after a clean drain).
pub async fn main_with(args: Args) -> ExitCode {
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("nodeslo-controller: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let telemetry = telemetry::init(SERVICE_NAME, &args.common)?;
    let shutdown = Shutdown::on_signals()?;
    let client = args.common.kube_client().await?;
    let mut registry = Registry::default();
    let controller_metrics = ControllerMetrics::register(&mut registry, SERVICE_NAME);
    let slo_metrics = metrics::SloMetrics::register(&mut registry);
    let service = Service::start(
        SERVICE_NAME,
        &args.common,
        registry,
        Some(client.clone()),
        shutdown.clone(),
    )
    .await?;
    let settings = controller::Settings {
        config_namespace: args.config_namespace,
        config_name: args.config_name,
        workers: args.workers,
        conflict_retry: Duration::from_millis(args.conflict_retry_ms),
        manager: SERVICE_NAME.to_string(),
    };
    let controller = controller::NodeSloController::new(
        client,
        settings,
        slo_metrics,
        controller_metrics,
        PerObjectBackoff::default(),
    );
    let run = controller.run(
        service.readiness().clone(),
        service.leader().clone(),
        shutdown.clone(),
    );
    service.run(run).await?;
    telemetry.shutdown().await;
    Ok(())
}
