//! Wiring of the `gw-recycler` binary; `main.rs` only parses flags and calls [`main_with`].
//! Controllers plug in at [`run_controllers`].

use std::process::ExitCode;

use capstan_runtime::cli::CommonArgs;
use capstan_runtime::controller::Binary;
use capstan_runtime::leader::LeaderHandle;
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::shutdown::Shutdown;

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
#[command(name = "gw-recycler", version, about, long_about = None)]
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
    capstan_runtime::controller::main_with(SERVICE_NAME, run(args)).await
}

/// Start-up, run until SIGTERM/SIGINT (or a lost lease), then drain in order.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut binary = Binary::start(SERVICE_NAME, &args.common)?;
    let metrics = ControllerMetrics::register(binary.registry(), args.role.controller_name());
    let shutdown = binary.shutdown().clone();
    binary
        .serve(None, |service| {
            let context = Context {
                metrics,
                leader: service.leader().clone(),
                shutdown,
            };
            service.readiness().set_ready(true);
            tracing::info!(role = ?args.role, "gw-recycler ready");
            run_controllers(context)
        })
        .await?;
    Ok(())
}

/// The controllers of this binary, for the whole process lifetime: they stop taking work when
/// shutdown is requested and return once in-flight reconciles are done. None are wired yet, so
/// this only waits for the shutdown request.
pub async fn run_controllers(context: Context) {
    context.shutdown.cancelled().await;
}
