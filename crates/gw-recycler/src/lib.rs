//! Wiring of the `gw-recycler` binary; `main.rs` only parses flags and calls [`main_with`].
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
pub const SERVICE_NAME: &str = "gw-recycler";

/// Which side of a gateway pair this instance serves.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Orchestrates: owns the state machine and writes `spec.state` / `spec.request`.
    Server,
    /// Performs the server's requests and writes `status.client.response`.
    Client,
}

impl Role {
    /// The `controller` label of this instance's reconcile metrics.
    pub fn controller_name(self) -> &'static str {
        match self {
            Self::Server => "gw-recycler-server",
            Self::Client => "gw-recycler-client",
        }
    }
}

/// Replaces a slice gateway deployment with a new one, make-before-break, through a finite
/// state machine persisted in a WorkerSliceGwRecycler resource on the hub cluster (KubeSlice
/// worker-operator compatible). The server instance owns the state machine and asks the client
/// instance for work; the client instance performs each request and posts the response.
#[derive(clap::Parser, Debug)]
#[command(name = "gw-recycler", version, about = "Replaces a slice gateway deployment with a new one, make-before-break, through a finite state machine persisted in a WorkerSliceGwRecycler resource on the hub cluster (KubeSlice worker-operator compatible). The server instance owns the state machine and asks the client instance for work; the client instance performs each request and posts the response.", long_about = None)]
pub struct Args {
    /// Which side of the gateway pair this instance runs.
    #[arg(long, env = "GW_RECYCLER_ROLE", value_enum)]
    pub role: Role,

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
            eprintln!("gw-recycler: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let telemetry = telemetry::init(SERVICE_NAME, &args.common)?;
    let shutdown = Shutdown::on_signals()?;
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry, args.role.controller_name());
    let service =
        Service::start(SERVICE_NAME, &args.common, registry, None, shutdown.clone()).await?;
    let context = Context {
        metrics,
        leader: service.leader().clone(),
        shutdown: shutdown.clone(),
    };
    service.readiness().set_ready(true);
    tracing::info!(role = ?args.role, "gw-recycler ready");
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
