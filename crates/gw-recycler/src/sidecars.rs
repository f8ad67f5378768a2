//! The gRPC calls the recycler and the gateway reconciler make to the slice router sidecar and
//! the gateway sidecars (`capstan-proto`'s clients), over lazily connected channels kept per
//! pod IP so a re-check costs one round trip; the gateway reconciler drops those of pods gone
//! ([`Sidecars::keep_only`]), as every recycle brings new IPs. Each call makes a `grpc` client span carrying the
//! trace context (`capstan_runtime::http_trace`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::{EcmpUpdateInfo, SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use capstan_proto::sidecar::{GwPodStatus, RemoteGwVpnIp};
use capstan_runtime::http_trace::{TraceLayer, Traced};
use tonic::transport::{Channel, Endpoint};
use tower::Layer as _;

/// A failed sidecar call.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("invalid sidecar address {address}: {source}")]
    Address {
        address: String,
        source: tonic::transport::Error,
    },
    #[error("sidecar at {address}: {status}")]
    Call {
        address: String,
        status: Box<tonic::Status>,
    },
}

impl SidecarError {
    /// The sidecar could not be reached (refused, timed out, no channel), as opposed to one that
    /// answered with an error.
    pub fn is_unreachable(&self) -> bool {
        match self {
            SidecarError::Address { .. } => true,
            SidecarError::Call { status, .. } => matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            SidecarError::Address { .. } => "sidecar_address",
            SidecarError::Call { .. } => "sidecar_call",
        }
    }
}

/// What [`Sidecars::withdraw_route`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    Withdrawn,
    /// The router does not implement `UpdateEcmpRoutes` (KubeSlice's answers UNIMPLEMENTED): the
    /// old gateway leaves the route with the next-hop list that excludes it.
    Unsupported,
}

/// Channels to sidecars by pod IP (all listen on one port).
#[derive(Clone)]
pub struct Sidecars {
    port: u16,
    timeout: Duration,
    channels: Arc<Mutex<HashMap<String, Traced<Channel>>>>,
    /// Router IPs that answered `UpdateEcmpRoutes` with UNIMPLEMENTED: not asked again.
    without_ecmp_updates: Arc<Mutex<HashSet<String>>>,
}

impl Sidecars {
    pub fn new(port: u16, timeout: Duration) -> Self {
        Self {
            port,
            timeout,
            channels: Arc::default(),
            without_ecmp_updates: Arc::default(),
        }
    }

    fn channel(&self, ip: &str) -> Result<(String, Traced<Channel>), SidecarError> {
        let address = format!("{ip}:{}", self.port);
        let mut channels = self.channels();
        if let Some(channel) = channels.get(ip) {
            return Ok((address, channel.clone()));
        }
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|source| SidecarError::Address {
                address: address.clone(),
                source,
            })?
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .tcp_nodelay(true);
        let channel = TraceLayer::grpc_client().layer(endpoint.connect_lazy());
        channels.insert(ip.to_owned(), channel.clone());
        Ok((address, channel))
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Traced<Channel>>> {
        lock(&self.channels)
    }

    /// Drops the channels to IPs not in `live` (the IPs of the pods still known); returns how
    /// many went. A pod that comes back at one of them gets a fresh channel on its next call.
    pub fn keep_only(&self, live: &HashSet<String>) -> usize {
        lock(&self.without_ecmp_updates).retain(|ip| live.contains(ip));
        let mut channels = self.channels();
        let before = channels.len();
        channels.retain(|ip, _| live.contains(ip));
        before - channels.len()
    }

    /// How many channels are open (or would connect on first use).
    pub fn open_channels(&self) -> usize {
        self.channels().len()
    }

    fn failed(address: String) -> impl FnOnce(tonic::Status) -> SidecarError {
        move |status| SidecarError::Call {
            address,
            status: Box::new(status),
        }
    }

    /// The gateway sidecar's `GetStatus`.
    pub async fn gateway_status(&self, pod_ip: &str) -> Result<GwPodStatus, SidecarError> {
        let (address, channel) = self.channel(pod_ip)?;
        let reply = GwSidecarServiceClient::new(channel)
            .get_status(())
            .await
            .map_err(Self::failed(address))?;
        Ok(reply.into_inner())
    }

    /// The gateway sidecar's `GetSliceGwRemotePodName`: the name of the peer pod its tunnel
    /// reaches at `remote_vpn_ip` (the SliceGateway's `sliceGatewayRemoteVpnIp`).
    pub async fn peer_pod_name(
        &self,
        pod_ip: &str,
        remote_vpn_ip: &str,
    ) -> Result<String, SidecarError> {
        let (address, channel) = self.channel(pod_ip)?;
        let reply = GwSidecarServiceClient::new(channel)
            .get_slice_gw_remote_pod_name(RemoteGwVpnIp {
                remote_gw_vpn_ip: remote_vpn_ip.to_owned(),
            })
            .await
            .map_err(Self::failed(address))?;
        Ok(reply.into_inner().gateway_pod_name)
    }

    /// CheckIfRouteInSliceRouter: the router routes `remote_subnet` via `nsm_ip`.
    pub async fn route_present(
        &self,
        router_ip: &str,
        remote_subnet: &str,
        nsm_ip: &str,
    ) -> Result<bool, SidecarError> {
        let (address, channel) = self.channel(router_ip)?;
        let reply = SliceRouterSidecarServiceClient::new(channel)
            .get_route_in_kernel(VerifyRouteAddRequest {
                nsm_ip: nsm_ip.to_owned(),
                dst_ip: remote_subnet.to_owned(),
            })
            .await
            .map_err(Self::failed(address))?;
        Ok(reply.into_inner().is_route_present)
    }

    /// Withdraws `nsm_ip` from the router's route to `remote_subnet` (`UpdateEcmpRoutes`). A
    /// router that answers UNIMPLEMENTED is said so once in the log and not asked again.
    pub async fn withdraw_route(
        &self,
        router_ip: &str,
        remote_subnet: &str,
        nsm_ip: &str,
    ) -> Result<Withdrawal, SidecarError> {
        if lock(&self.without_ecmp_updates).contains(router_ip) {
            return Ok(Withdrawal::Unsupported);
        }
        let (address, channel) = self.channel(router_ip)?;
        let reply = SliceRouterSidecarServiceClient::new(channel)
            .update_ecmp_routes(EcmpUpdateInfo {
                remote_slice_gw_nsm_subnet: remote_subnet.to_owned(),
                nsm_ip_to_remove: nsm_ip.to_owned(),
            })
            .await;
        match reply {
            Ok(_) => Ok(Withdrawal::Withdrawn),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::warn!(
                    router = %address,
                    "the slice router does not implement UpdateEcmpRoutes (as KubeSlice's): old \
                     gateways leave its routes through the next-hop lists that exclude them"
                );
                lock(&self.without_ecmp_updates).insert(router_ip.to_owned());
                Ok(Withdrawal::Unsupported)
            }
            Err(status) => Err(Self::failed(address)(status)),
        }
    }

    /// Sets the router's next hops towards `remote_subnet` (`UpdateSliceGwConnectionContext`).
    pub async fn set_next_hops(
        &self,
        router_ip: &str,
        remote_subnet: &str,
        next_hops: &[String],
    ) -> Result<(), SidecarError> {
        let (address, channel) = self.channel(router_ip)?;
        SliceRouterSidecarServiceClient::new(channel)
            .update_slice_gw_connection_context(SliceGwConContext {
                remote_slice_gw_nsm_subnet: remote_subnet.to_owned(),
                local_nsm_gw_peer_ip_list: next_hops.to_vec(),
                ..SliceGwConContext::default()
            })
            .await
            .map_err(Self::failed(address))?;
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn channels_of_pods_gone_are_dropped_and_those_alive_kept() {
        let sidecars = Sidecars::new(5000, Duration::from_secs(1));
        for ip in ["10.1.0.1", "10.1.0.2", "10.1.0.3"] {
            sidecars.channel(ip).expect("a valid address");
        }
        let live = HashSet::from(["10.1.0.2".to_owned(), "10.9.9.9".to_owned()]);
        let evicted = sidecars.keep_only(&live);
        assert_eq!(evicted, 2);
        assert_eq!(sidecars.open_channels(), 1);
        let (address, _) = sidecars.channel("10.1.0.2").expect("a valid address");
        assert_eq!(address, "10.1.0.2:5000");
    }

    /// A router sidecar as KubeSlice's answers: no `UpdateEcmpRoutes`, and a route check that
    /// fails inside the router (it is there, but cannot say).
    #[derive(Default, Clone)]
    struct KubeSliceLikeRouter {
        ecmp_calls: Arc<std::sync::atomic::AtomicUsize>,
    }

    #[tonic::async_trait]
    impl capstan_proto::router::slice_router_sidecar_service_server::SliceRouterSidecarService
        for KubeSliceLikeRouter
    {
        async fn update_slice_gw_connection_context(
            &self,
            _: tonic::Request<SliceGwConContext>,
        ) -> Result<tonic::Response<capstan_proto::router::SidecarResponse>, tonic::Status>
        {
            Ok(tonic::Response::new(Default::default()))
        }
        async fn get_slice_router_client_connection_info(
            &self,
            _: tonic::Request<()>,
        ) -> Result<tonic::Response<capstan_proto::router::ClientConnectionInfo>, tonic::Status>
        {
            Ok(tonic::Response::new(Default::default()))
        }
        async fn get_route_in_kernel(
            &self,
            _: tonic::Request<VerifyRouteAddRequest>,
        ) -> Result<tonic::Response<capstan_proto::router::VerifyRouteAddResponse>, tonic::Status>
        {
            Err(tonic::Status::internal("netlink: operation not permitted"))
        }
        async fn update_ecmp_routes(
            &self,
            _: tonic::Request<EcmpUpdateInfo>,
        ) -> Result<tonic::Response<capstan_proto::router::SidecarResponse>, tonic::Status>
        {
            self.ecmp_calls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(tonic::Status::unimplemented("UpdateEcmpRoutes"))
        }
    }

    async fn serve(router: KubeSliceLikeRouter) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let port = listener.local_addr().expect("address").port();
        let service =
            capstan_proto::router::slice_router_sidecar_service_server::SliceRouterSidecarServiceServer::new(router);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        port
    }

    #[tokio::test]
    async fn a_router_without_ecmp_updates_is_asked_once_and_its_failed_route_check_is_not_unreachable()
     {
        let router = KubeSliceLikeRouter::default();
        let port = serve(router.clone()).await;
        let sidecars = Sidecars::new(port, Duration::from_secs(5));
        for _ in 0..3 {
            let withdrawal = sidecars
                .withdraw_route("127.0.0.1", "10.2.0.0/16", "10.1.0.1")
                .await
                .expect("UNIMPLEMENTED is no error");
            assert_eq!(withdrawal, Withdrawal::Unsupported);
        }
        assert_eq!(
            router.ecmp_calls.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "asked once, not every pass"
        );
        let failed = sidecars
            .route_present("127.0.0.1", "10.2.0.0/16", "10.1.0.1")
            .await
            .expect_err("the router failed the check");
        assert!(!failed.is_unreachable(), "{failed}");

        // Nothing listens on the port of a closed listener: that is unreachable.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let gone_port = closed.local_addr().expect("address").port();
        drop(closed);
        let away = Sidecars::new(gone_port, Duration::from_secs(5))
            .route_present("127.0.0.1", "10.2.0.0/16", "10.1.0.1")
            .await
            .expect_err("nothing listens");
        assert!(away.is_unreachable(), "{away}");
    }
}
