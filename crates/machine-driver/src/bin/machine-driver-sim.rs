//! Serves the simulated provider over gRPC (`capstan.machine.v1.MachineDriver`), so that the
//! machineclass-controller can use it with `--driver grpc://host:port`.
//! Prints `driver listening on ADDR` once bound; takes the common flags of every binary (admin
//! server, logs, traces).

// mimalloc: glibc malloc showed as a large share of CPU in profiles (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use capstan_apis::machine::GoDuration;
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::controller::Binary;
use clap::Parser;
use machine_driver::sim::{SimConfig, SimDriver};

/// Binary, service and tracer name.
const SERVICE_NAME: &str = "machine-driver-sim";

/// Simulated MCM provider served over gRPC.
#[derive(Parser, Debug)]
#[command(name = "machine-driver-sim", version, about, long_about = None)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:9443")]
    listen: SocketAddr,
    /// Namespace of the VM records.
    #[arg(long, env = "NAMESPACE", default_value = "default")]
    namespace: String,
    /// Time until a new VM's Node turns Ready (Go duration, as machineclass-controller's
    /// `--sim-ready-delay`).
    #[arg(long, env = "SIM_READY_DELAY", default_value = "2s", value_parser = parse_duration)]
    sim_ready_delay: Duration,
}

/// A Go duration up to `MAX_READY_DELAY`, refused (not a panic) otherwise.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let delay = GoDuration::new(text).to_std().map_err(|e| e.to_string())?;
    let max = machine_driver::simulate::MAX_READY_DELAY;
    if delay > max {
        return Err(format!("must be at most {}s, found {text}", max.as_secs()));
    }
    Ok(delay)
}

#[tokio::main]
async fn main() -> ExitCode {
    capstan_runtime::controller::main_with(SERVICE_NAME, run(Args::parse())).await
}

async fn run(args: Args) -> anyhow::Result<()> {
    let binary = Binary::start(SERVICE_NAME, &args.common)?;
    let client = binary.kube_client().await.context("kube client")?;
    let driver = Arc::new(SimDriver::new(
        client.clone(),
        SimConfig {
            namespace: args.namespace,
            ready_delay: args.sim_ready_delay,
        },
    ));
    let resumed = driver.resume().await.context("resume VMs")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("bind {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(resumed, "driver listening on {addr}");
    println!("driver listening on {addr}");
    let shutdown = binary.shutdown().clone();
    binary
        .serve(Some(client), |service| {
            service.readiness().set_ready(true);
            async move {
                machine_driver::grpc::serve(
                    driver,
                    listener,
                    async move { shutdown.cancelled().await },
                )
                .await
            }
        })
        .await??;
    Ok(())
}
