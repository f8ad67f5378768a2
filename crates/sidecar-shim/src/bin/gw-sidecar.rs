//! `gw-sidecar`: KubeSlice's `sidecar.GwSidecarService` for a slice gateway pod.
//!
//! A new gateway pod, and so a new `gw-sidecar`, starts with every recycle, and what it serves is
//! a few calls a second: it runs on one thread with the system allocator. mimalloc's start (its
//! arena bitmaps and page map, half the user time of a start in perf) and a worker thread per core
//! cost about 4.4 ms of CPU per start and exit; without them about 2.5 ms, and the port is bound
//! about 1 ms sooner (150 starts of each, measured by their parent's rusage).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::shutdown::Shutdown;
use clap::Parser;
use prometheus_client::registry::Registry;
use sidecar_shim::gw::kernel::KernelGw;
use sidecar_shim::gw::memory::{MemoryGw, MemoryGwStatus, MemoryTunnel};
use sidecar_shim::gw::{DEFAULT_PEER_PORT, GwBackend, GwSidecar, PeerConfig, PodIdentity};
use sidecar_shim::server::{BackendKind, GrpcArgs, run_sidecar};
use tonic::transport::{Certificate, ClientTlsConfig};

const NAME: &str = "gw-sidecar";

#[derive(Parser, Debug)]
#[command(name = NAME, version, about = "Slice gateway sidecar: pod and tunnel status, remote subnet route (KubeSlice-compatible gRPC)")]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    grpc: GrpcArgs,

    /// Where the gateway state comes from.
    #[arg(long, env = "SIDECAR_BACKEND", value_enum, default_value_t = BackendKind::Kernel)]
    backend: BackendKind,

    /// Kernel backend: read and program this network namespace (a name under /run/netns
    /// or a path) instead of the process's own.
    #[arg(long, env = "SIDECAR_NETNS")]
    netns: Option<String>,

    /// Kernel backend: milliseconds between tunnel checks (DOWN after 20 checks at 100% loss).
    #[arg(long, env = "TUNNEL_CHECK_INTERVAL_MS", default_value_t = 1000)]
    tunnel_check_interval_ms: u64,

    /// Node IP reported by GetStatus.
    #[arg(long, env = "NODE_IP", default_value = "")]
    node_ip: String,

    /// Pod IP reported by GetStatus.
    #[arg(long, env = "POD_IP", default_value = "")]
    pod_ip: String,

    /// Pod name reported by GetStatus (default: the host name).
    #[arg(long, env = "HOSTNAME")]
    pod_name: Option<String>,

    /// Port of the peer gateway's sidecar for GetSliceGwRemotePodName.
    #[arg(long, env = "PEER_GRPC_PORT", default_value_t = DEFAULT_PEER_PORT)]
    peer_port: u16,

    /// Timeout in milliseconds for calls to the peer gateway's sidecar.
    #[arg(long, env = "PEER_TIMEOUT_MS", default_value_t = 5000)]
    peer_timeout_ms: u64,

    /// PEM CA bundle: call peer sidecars over TLS, trusting this CA.
    #[arg(long, env = "PEER_TLS_CA")]
    peer_tls_ca: Option<PathBuf>,

    /// Server name expected in peer certificates (default: the peer IP).
    #[arg(long, env = "PEER_TLS_DOMAIN", requires = "peer_tls_ca")]
    peer_tls_domain: Option<String>,

    /// Memory backend: IPv4 address of nsm0.
    #[arg(long, env = "MEMORY_NSM_IP", default_value = "")]
    nsm_ip: String,

    /// Memory backend: tunnel interface name (no tunnel, reported DOWN, without it).
    #[arg(long, env = "MEMORY_TUNNEL_INTERFACE")]
    tunnel_interface: Option<String>,

    /// Memory backend: tunnel local IP.
    #[arg(long, env = "MEMORY_TUNNEL_LOCAL_IP", default_value = "")]
    tunnel_local_ip: String,

    /// Memory backend: tunnel peer IP.
    #[arg(long, env = "MEMORY_TUNNEL_PEER_IP", default_value = "")]
    tunnel_peer_ip: String,

    /// Memory backend: report the tunnel DOWN.
    #[arg(long, env = "MEMORY_TUNNEL_DOWN")]
    tunnel_down: bool,
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

fn peer_config(args: &Args) -> anyhow::Result<PeerConfig> {
    let tls = match &args.peer_tls_ca {
        None => None,
        Some(ca) => {
            let pem = std::fs::read(ca).with_context(|| format!("read {}", ca.display()))?;
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
            if let Some(domain) = &args.peer_tls_domain {
                tls = tls.domain_name(domain.clone());
            }
            Some(tls)
        }
    };
    Ok(PeerConfig {
        port: args.peer_port,
        timeout: Duration::from_millis(args.peer_timeout_ms),
        tls,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = capstan_runtime::telemetry::init(NAME, &args.common)?;
    let shutdown = Shutdown::on_signals()?;
    let mut extra_admin = axum::Router::new();
    let backend: Arc<dyn GwBackend> = match args.backend {
        BackendKind::Kernel => {
            let netns = args.netns.as_deref().map(sidecar_shim::netns::resolve);
            let interval = Duration::from_millis(args.tunnel_check_interval_ms.max(1));
            let kernel = KernelGw::connect(netns.as_deref(), interval)?;
            kernel.require_net_admin().await?;
            Arc::new(kernel)
        }
        BackendKind::Memory => {
            let tunnel = args.tunnel_interface.as_ref().map(|name| MemoryTunnel {
                net_interface: name.clone(),
                local_ip: args.tunnel_local_ip.clone(),
                peer_ip: args.tunnel_peer_ip.clone(),
                down: args.tunnel_down,
                ..MemoryTunnel::default()
            });
            let memory = Arc::new(MemoryGw::new(MemoryGwStatus {
                nsm_ip: args.nsm_ip.clone(),
                tunnel,
                ..MemoryGwStatus::default()
            }));
            extra_admin = memory.clone().admin_router();
            memory
        }
    };
    let identity = PodIdentity {
        node_ip: args.node_ip.clone(),
        pod_ip: args.pod_ip.clone(),
        pod_name: args
            .pod_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(host_name),
    };
    tracing::info!(backend = ?args.backend, pod = %identity.pod_name, "starting");
    let service = GwSidecar::new(backend, identity, peer_config(&args)?).into_server();
    run_sidecar(
        NAME,
        &args.common,
        &args.grpc,
        Registry::default(),
        service,
        extra_admin,
        shutdown,
    )
    .await
}
