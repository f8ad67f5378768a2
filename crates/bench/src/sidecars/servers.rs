//! The servers a sidecar case calls: the real router and gw sidecars (memory or kernel backend)
//! and an empty handler on the same tonic stack (metrics layer, health service), each on
//! 127.0.0.1:0 and stopped when dropped.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use capstan_proto::router::slice_router_sidecar_service_server::{
    SliceRouterSidecarService, SliceRouterSidecarServiceServer,
};
use capstan_proto::router::{self as rt, SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::gw_sidecar_service_server::{GwSidecarService, GwSidecarServiceServer};
use capstan_proto::sidecar::{self as gwp, GwPodStatus};
use capstan_testkit::netns::Netns;
use sidecar_shim::gw::kernel::KernelGw;
use sidecar_shim::gw::memory::{MemoryGw, MemoryGwStatus, MemoryTunnel};
use sidecar_shim::gw::{GwSidecar, PeerConfig, PodIdentity};
use sidecar_shim::router::RouterSidecar;
use sidecar_shim::router::kernel::KernelRouter;
use sidecar_shim::router::memory::MemoryRouter;
use sidecar_shim::server::SpawnedServer;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// A server on 127.0.0.1:0 and a channel to it; the server stops when this is dropped.
pub struct BenchServer {
    pub channel: Channel,
    _server: SpawnedServer,
}

async fn start<S>(service: S) -> Result<BenchServer>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let server = sidecar_shim::server::spawn(TcpListener::bind("127.0.0.1:0").await?, service)?;
    let addr = server.addr;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to the bench server at {addr}"))?;
    Ok(BenchServer {
        channel,
        _server: server,
    })
}

/// The empty handlers of both services: the floor every case is compared with.
pub struct EmptyServers {
    pub router: BenchServer,
    pub gw: BenchServer,
}

impl EmptyServers {
    pub async fn start() -> Result<Self> {
        Ok(Self {
            router: start(SliceRouterSidecarServiceServer::new(EmptyHandler)).await?,
            gw: start(GwSidecarServiceServer::new(EmptyHandler)).await?,
        })
    }
}

/// The sidecar servers of one backend, plus what must outlive them.
pub struct Sidecars {
    pub router: BenchServer,
    pub gw: BenchServer,
    /// Deleted after the servers stop (fields drop in declaration order).
    _netns: Option<Netns>,
}

fn gw_identity() -> PodIdentity {
    PodIdentity {
        node_ip: "192.0.2.10".into(),
        pod_ip: "10.244.1.7".into(),
        pod_name: "gw-bench-0".into(),
    }
}

impl Sidecars {
    pub async fn memory() -> Result<Self> {
        let router =
            start(RouterSidecar::new(Arc::new(MemoryRouter::default())).into_server()).await?;
        let gw_backend = Arc::new(MemoryGw::new(MemoryGwStatus {
            nsm_ip: "10.1.1.1".into(),
            tunnel: Some(MemoryTunnel {
                net_interface: "tun0".into(),
                local_ip: "10.8.0.1".into(),
                peer_ip: "10.8.0.2".into(),
                ..MemoryTunnel::default()
            }),
            ..MemoryGwStatus::default()
        }));
        let gw =
            start(GwSidecar::new(gw_backend, gw_identity(), PeerConfig::default()).into_server())
                .await?;
        Ok(Self {
            router,
            gw,
            _netns: None,
        })
    }

    /// Kernel sidecars in a fresh network namespace (needs root and iproute2).
    pub async fn kernel() -> Result<Self> {
        let netns = super::netns::create().context("creating the bench network namespace")?;
        let path = netns.path();
        let router_backend =
            KernelRouter::connect(Some(&path)).context("kernel router backend (netlink)")?;
        let gw_backend = KernelGw::connect(Some(&path), Duration::from_secs(1))
            .context("kernel gw backend (netlink)")?;
        let router = start(RouterSidecar::new(Arc::new(router_backend)).into_server()).await?;
        let gw = start(
            GwSidecar::new(Arc::new(gw_backend), gw_identity(), PeerConfig::default())
                .into_server(),
        )
        .await?;
        Ok(Self {
            router,
            gw,
            _netns: Some(netns),
        })
    }
}

/// Answers every call with an empty message: the baseline of the tonic stack.
#[derive(Clone, Copy, Debug, Default)]
struct EmptyHandler;

#[tonic::async_trait]
impl SliceRouterSidecarService for EmptyHandler {
    async fn update_slice_gw_connection_context(
        &self,
        _: Request<SliceGwConContext>,
    ) -> Result<Response<rt::SidecarResponse>, Status> {
        Ok(Response::new(rt::SidecarResponse::default()))
    }
    async fn get_slice_router_client_connection_info(
        &self,
        _: Request<()>,
    ) -> Result<Response<rt::ClientConnectionInfo>, Status> {
        Ok(Response::new(rt::ClientConnectionInfo::default()))
    }
    async fn get_route_in_kernel(
        &self,
        _: Request<VerifyRouteAddRequest>,
    ) -> Result<Response<rt::VerifyRouteAddResponse>, Status> {
        Ok(Response::new(rt::VerifyRouteAddResponse::default()))
    }
    async fn update_ecmp_routes(
        &self,
        _: Request<rt::EcmpUpdateInfo>,
    ) -> Result<Response<rt::SidecarResponse>, Status> {
        Ok(Response::new(rt::SidecarResponse::default()))
    }
}

#[tonic::async_trait]
impl GwSidecarService for EmptyHandler {
    async fn get_status(&self, _: Request<()>) -> Result<Response<GwPodStatus>, Status> {
        Ok(Response::new(GwPodStatus::default()))
    }
    async fn get_slice_gw_remote_pod_name(
        &self,
        _: Request<gwp::RemoteGwVpnIp>,
    ) -> Result<Response<GwPodStatus>, Status> {
        Ok(Response::new(GwPodStatus::default()))
    }
    async fn update_connection_context(
        &self,
        _: Request<gwp::SliceGwConnectionContext>,
    ) -> Result<Response<gwp::SidecarResponse>, Status> {
        Ok(Response::new(gwp::SidecarResponse::default()))
    }
    async fn update_slice_qos_profile(
        &self,
        _: Request<gwp::SliceQosProfile>,
    ) -> Result<Response<gwp::SidecarResponse>, Status> {
        Ok(Response::new(gwp::SidecarResponse::default()))
    }
}
