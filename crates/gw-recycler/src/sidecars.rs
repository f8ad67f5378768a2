//! The gRPC calls the recycler and the gateway reconciler make to the slice router sidecar and
//! the gateway sidecars (`capstan-proto`'s clients), over lazily connected channels kept per
//! pod IP so a re-check costs one round trip; the gateway reconciler drops those of pods gone
//! ([`Sidecars::keep_only`]), as every recycle brings new IPs. Each call makes a `grpc` client span carrying the
//! trace context (`capstan_runtime::http_trace`).

use std::collections::{HashMap, HashSet};
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

/// Channels to sidecars by pod IP (all listen on one port).
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

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Traced<Channel>>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the channels to IPs not in `live` (the IPs of the pods still known); returns how
    /// many went. A pod that comes back at one of them gets a fresh channel on its next call.
    pub fn keep_only(&self, live: &HashSet<String>) -> usize {
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
}
