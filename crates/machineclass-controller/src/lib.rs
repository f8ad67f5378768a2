//! Wiring of the `machineclass-controller` binary; `main.rs` only parses flags and calls [`main_with`].
//! Controllers plug in at [`run_controllers`].

use std::process::ExitCode;

use capstan_runtime::cli::CommonArgs;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::service::Service;
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::telemetry;
use prometheus_client::registry::Registry;

/// Binary, service, Lease and tracer name.
pub const SERVICE_NAME: &str = "machineclass-controller";

/// Guards MachineClasses with finalizers while Machines use them, and drives the Machine
/// lifecycle through a provider driver (Gardener machine-controller-manager compatible, API group
/// `machine.sapcloud.io/v1alpha1`). Every replica watches; only the elected leader writes.
#[derive(clap::Parser, Debug)]
#[command(name = "machineclass-controller", version, about = "Guards MachineClasses with finalizers while Machines use them, and drives the Machine lifecycle through a provider driver (Gardener machine-controller-manager compatible, API group machine.sapcloud.io/v1alpha1). Every replica watches; only the elected leader writes.", long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// What the controllers of this binary are handed.
#[derive(Clone, Debug)]
pub struct Context {
    pub metrics: ControllerMetrics,
    /// Gate every write on `leader.is_leader()`.
    pub leader: LeaderHandle,
    /// Stop starting reconciles once `shutdown.token()` is cancelled.
    pub shutdown: Shutdown,
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

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let telemetry = telemetry::init(SERVICE_NAME, &args.common)?;
    let shutdown = Shutdown::on_signals()?;
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry, SERVICE_NAME);
    let service =
        Service::start(SERVICE_NAME, &args.common, registry, None, shutdown.clone()).await?;
    let context = Context {
        metrics,
        leader: service.leader().clone(),
        shutdown: shutdown.clone(),
    };
    service.readiness().set_ready(true);
    tracing::info!("machineclass-controller ready");
    service.run(run_controllers(context)).await?;
    telemetry.shutdown().await;
    Ok(())
}

/// The controllers of this binary, for the whole process lifetime: they stop taking work when
/// shutdown is requested and return once in-flight reconciles are done. None are wired yet, so
/// this only waits for the shutdown request.
pub async fn run_controllers(context: Context) {
    context.shutdown.cancelled().await;
}
