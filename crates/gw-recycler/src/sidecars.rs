//! The gRPC calls the recycler and the gateway reconciler make to the slice router sidecar and
//! the gateway sidecars (`capstan-proto`'s clients), over lazily connected channels kept per
//! address so a re-check costs one round trip. Each call makes a `grpc` client span carrying the
//! trace context (`capstan_runtime::http_trace`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::{EcmpUpdateInfo, SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::GwPodStatus;
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
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
    pub fn metric_label(&self) -> &'static str {
        match self {
            SidecarError::Address { .. } => "sidecar_address",
            SidecarError::Call { .. } => "sidecar_call",
        }
    }
}

/// Channels to sidecars by `ip:port`.
#[derive(Clone)]
pub struct Sidecars {
    port: u16,
    timeout: Duration,
    channels: Arc<Mutex<HashMap<String, Traced<Channel>>>>,
}

impl Sidecars {
    pub fn new(port: u16, timeout: Duration) -> Self {
        Self {
            port,
            timeout,
            channels: Arc::default(),
        }
    }

    fn channel(&self, ip: &str) -> Result<(String, Traced<Channel>), SidecarError> {
        let address = format!("{ip}:{}", self.port);
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channel) = channels.get(&address) {
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
        channels.insert(address.clone(), channel.clone());
        Ok((address, channel))
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

    /// Withdraws `nsm_ip` from the router's route to `remote_subnet` (`UpdateEcmpRoutes`).
    pub async fn withdraw_route(
        &self,
        router_ip: &str,
        remote_subnet: &str,
        nsm_ip: &str,
    ) -> Result<(), SidecarError> {
        let (address, channel) = self.channel(router_ip)?;
        SliceRouterSidecarServiceClient::new(channel)
            .update_ecmp_routes(EcmpUpdateInfo {
                remote_slice_gw_nsm_subnet: remote_subnet.to_owned(),
                nsm_ip_to_remove: nsm_ip.to_owned(),
            })
            .await
            .map_err(Self::failed(address))?;
        Ok(())
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
