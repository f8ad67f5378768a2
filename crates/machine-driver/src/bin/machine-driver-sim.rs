//! Serves the simulated provider over gRPC (`capstan.machine.v1.MachineDriver`), so that the
//! machineclass-controller can use it with `--driver grpc://host:port`.
//! Prints `driver listening on ADDR` once bound.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use capstan_runtime::cli::LogFormat;
use clap::Parser;
use machine_driver::sim::{SimConfig, SimDriver};

#[derive(Parser, Debug)]
#[command(
    name = "machine-driver-sim",
    about = "Simulated MCM provider served over gRPC"
)]
struct Args {
    /// Kubeconfig of the cluster where VMs are recorded and Nodes registered.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:9443")]
    listen: SocketAddr,
    /// Namespace of the VM records.
    #[arg(long, env = "NAMESPACE", default_value = "default")]
    namespace: String,
    /// Seconds until a new VM's Node turns Ready.
    #[arg(long, env = "SIM_READY_DELAY", default_value = "2", value_parser = parse_ready_delay)]
    ready_delay_seconds: Duration,
    /// Log filter.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    log_level: String,
}

/// Seconds in `0..=MAX_READY_DELAY`, refused (not a panic) otherwise.
fn parse_ready_delay(text: &str) -> Result<Duration, String> {
    let max = machine_driver::simulate::MAX_READY_DELAY;
    machine_driver::simulate::seconds_in_range(text.parse().ok(), max)
        .ok_or_else(|| format!("expected seconds between 0 and {}", max.as_secs()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let common = capstan_runtime::cli::CommonArgs {
        kubeconfig: args.kubeconfig.clone(),
        metrics_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        log_format: LogFormat::Text,
        log_level: args.log_level.clone(),
        otlp_endpoint: None,
        leader: capstan_runtime::cli::LeaderElectionArgs {
            leader_elect: false,
            lease_name: None,
            lease_namespace: "default".into(),
            lease_duration_seconds: 15,
            lease_grace_seconds: 5,
            identity: None,
        },
    };
    let _telemetry = capstan_runtime::telemetry::init("machine-driver-sim", &common)?;
    let client = common.kube_client().await.context("kube client")?;
    let driver = Arc::new(SimDriver::new(
        client,
        SimConfig {
            namespace: args.namespace,
            ready_delay: args.ready_delay_seconds,
        },
    ));
    let resumed = driver.resume().await.context("resume VMs")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .context("bind")?;
    let addr = listener.local_addr()?;
    tracing::info!(resumed, "driver listening on {addr}");
    println!("driver listening on {addr}");
    let signals = capstan_runtime::shutdown::Shutdown::on_signals()?;
    let shutdown = async move { signals.cancelled().await };
    machine_driver::grpc::serve(driver, listener, shutdown).await?;
    Ok(())
}
