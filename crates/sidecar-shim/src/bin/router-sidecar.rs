//! `router-sidecar`: KubeSlice's `router.SliceRouterSidecarService` for the slice router pod.

// mimalloc: glibc malloc showed as a large share of CPU in profiles (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;

use capstan_proto::router::ConnectionInfo;
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::shutdown::Shutdown;
use clap::Parser;
use prometheus_client::registry::Registry;
use sidecar_shim::router::kernel::KernelRouter;
use sidecar_shim::router::memory::{MemoryRouter, parse_connection};
use sidecar_shim::router::{RouterBackend, RouterSidecar};
use sidecar_shim::server::{BackendKind, GrpcArgs, run_sidecar};

const NAME: &str = "router-sidecar";

#[derive(Parser, Debug)]
#[command(name = NAME, version, about = "Slice router sidecar: ECMP routes to remote slice subnets (KubeSlice-compatible gRPC)")]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    grpc: GrpcArgs,

    /// Where routes live.
    #[arg(long, env = "SIDECAR_BACKEND", value_enum, default_value_t = BackendKind::Kernel)]
    backend: BackendKind,

    /// Kernel backend: program this network namespace (a name under /run/netns or a path)
    /// instead of the process's own.
    #[arg(long, env = "SIDECAR_NETNS")]
    netns: Option<String>,

    /// Memory backend: a connected client as POD,INTERFACE,NSM_IP,NSM_PEER_IP (repeatable).
    #[arg(long = "client-connection", value_parser = parse_connection)]
    client_connections: Vec<ConnectionInfo>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = capstan_runtime::telemetry::init(NAME, &args.common)?;
    let shutdown = Shutdown::on_signals()?;
    let backend: Arc<dyn RouterBackend> = match args.backend {
        BackendKind::Kernel => {
            let netns = args.netns.as_deref().map(sidecar_shim::netns::resolve);
            let kernel = KernelRouter::connect(netns.as_deref())?;
            kernel.require_net_admin().await?;
            Arc::new(kernel)
        }
        BackendKind::Memory => Arc::new(MemoryRouter::new(args.client_connections.clone())),
    };
    tracing::info!(backend = ?args.backend, "starting");
    let service = RouterSidecar::new(backend).into_server();
    run_sidecar(
        NAME,
        &args.common,
        &args.grpc,
        Registry::default(),
        service,
        axum::Router::new(),
        shutdown,
    )
    .await
}
