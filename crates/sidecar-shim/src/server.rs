//! What both sidecar binaries share: gRPC flags, the gRPC server (health
//! service, metrics layer, optional TLS, graceful shutdown) and the process
//! lifecycle around it.

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use capstan_runtime::admin::{self, AdminState};
use capstan_runtime::cli::CommonArgs;
use capstan_runtime::shutdown::Shutdown;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::metrics::{GrpcMetrics, GrpcMetricsLayer};

/// Log line (prefix) with the bound gRPC address; process tests parse it.
pub const GRPC_LISTENING_MARKER: &str = "grpc server listening on ";

/// KubeSlice's sidecar port.
pub const DEFAULT_GRPC_PORT: u16 = 5000;

/// Which backend a sidecar uses.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Real routes and interfaces through netlink (needs CAP_NET_ADMIN).
    Kernel,
    /// State in the process, for tests and the demo.
    Memory,
}

/// gRPC server flags.
#[derive(clap::Args, Clone, Debug)]
pub struct GrpcArgs {
    /// gRPC listen address (port 0 picks a free port). Default: 0.0.0.0 on `GRPC_PORT`.
    #[arg(long, env = "GRPC_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// gRPC port when `--listen` is not given (KubeSlice's `GRPC_PORT`).
    #[arg(long, env = "GRPC_PORT", default_value_t = DEFAULT_GRPC_PORT)]
    pub grpc_port: u16,

    /// PEM certificate chain: serve TLS instead of plaintext.
    #[arg(long, env = "GRPC_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for `--tls-cert`.
    #[arg(long, env = "GRPC_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle: require client certificates signed by it (mutual TLS).
    #[arg(long, env = "GRPC_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

impl GrpcArgs {
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
            .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::UNSPECIFIED, self.grpc_port)))
    }

    /// The TLS configuration, when `--tls-cert` is given.
    pub fn tls_config(&self) -> anyhow::Result<Option<ServerTlsConfig>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("read {}", path.display()))
        };
        let mut config =
            ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?));
        if let Some(ca) = &self.tls_client_ca {
            config = config.client_ca_root(Certificate::from_pem(read(ca)?));
        }
        Ok(Some(config))
    }
}

/// Serves `service` and the standard gRPC health service on `listener` until
/// `shutdown` resolves, then drains in-flight calls.
pub async fn serve<S>(
    listener: TcpListener,
    service: S,
    metrics: GrpcMetrics,
    tls: Option<ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<S>().await;
    let known = [S::NAME.to_owned(), "grpc.health.v1.Health".to_owned()];
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        .layer(GrpcMetricsLayer::new(metrics, known))
        .add_service(health_service)
        .add_service(service)
        // Small unary replies: without TCP_NODELAY, Nagle meets the client's delayed ACK and a
        // reply can wait ~40 ms.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

/// A plaintext gRPC server run by [`spawn`] on the current Tokio runtime; it stops (draining
/// in-flight calls) when this is dropped.
#[derive(Debug)]
pub struct SpawnedServer {
    pub addr: SocketAddr,
    /// The server's gRPC metrics (in a registry of its own).
    pub metrics: GrpcMetrics,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serves `service` as [`serve`] does, plaintext, on `listener` in a task of its own: the
/// in-process sidecar the tests and the benchmark call.
pub fn spawn<S>(listener: TcpListener, service: S) -> std::io::Result<SpawnedServer>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let addr = listener.local_addr()?;
    let metrics = GrpcMetrics::register(&mut Registry::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served_metrics = metrics.clone();
    tokio::spawn(async move {
        // Resolves on a send or when the sender is dropped.
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(error) = serve(listener, service, served_metrics, None, shutdown).await {
            tracing::error!(%error, %addr, "gRPC server failed");
        }
    });
    Ok(SpawnedServer {
        addr,
        metrics,
        _stop: stop,
    })
}

/// A sidecar process from start to exit: binds the gRPC listener (logging
/// `grpc server listening on ADDR`), serves the admin endpoints plus `extra_admin`
/// on `--metrics-addr` (logging `admin server listening on ADDR`), serves gRPC until
/// SIGTERM/SIGINT, drains, and stops the admin server last.
pub async fn run_sidecar<S>(
    name: &str,
    common: &CommonArgs,
    grpc: &GrpcArgs,
    mut registry: Registry,
    service: S,
    extra_admin: axum::Router,
    shutdown: Shutdown,
) -> anyhow::Result<()>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let metrics = GrpcMetrics::register(&mut registry);
    let tls = grpc.tls_config()?;
    let listen = grpc.listen_addr();
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind gRPC listener {listen}"))?;
    let grpc_addr = listener.local_addr()?;
    tracing::info!(
        service = name,
        tls = tls.is_some(),
        "{GRPC_LISTENING_MARKER}{grpc_addr}"
    );

    let state = AdminState::new(registry);
    let readiness = state.readiness.clone();
    let admin_listener = TcpListener::bind(common.metrics_addr)
        .await
        .with_context(|| format!("bind admin listener {}", common.metrics_addr))?;
    let admin_addr = admin_listener.local_addr()?;
    let app = admin::router(state).merge(extra_admin);
    let admin_shutdown = shutdown.clone();
    let admin_task = tokio::spawn(async move {
        axum::serve(admin_listener, app)
            .with_graceful_shutdown(async move { admin_shutdown.completed().await })
            .await
    });
    tracing::info!(service = name, "admin server listening on {admin_addr}");

    readiness.set_ready(true);
    let drain = shutdown.clone();
    let served = serve(listener, service, metrics, tls, async move {
        drain.cancelled().await
    })
    .await;
    readiness.set_ready(false);
    tracing::info!(service = name, "gRPC server drained");
    shutdown.complete();
    admin_task
        .await
        .context("admin server task")?
        .context("admin server")?;
    tracing::info!(service = name, "admin server stopped");
    served.context("gRPC server")?;
    Ok(())
}
