//! `sidecar.GwSidecarService`: status of a slice gateway pod, the route to the
//! remote slice subnet, and QoS.

pub mod kernel;
pub mod memory;
pub mod tunnel;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use capstan_proto::sidecar::{
    ClassType, GwPodStatus, NsmInterfaceStatus, RemoteGwVpnIp, SidecarResponse,
    SliceGwConnectionContext, SliceQosProfile, TcType, TunnelInterfaceStatus,
    gw_sidecar_service_client::GwSidecarServiceClient,
    gw_sidecar_service_server::{GwSidecarService, GwSidecarServiceServer},
};
use tonic::transport::{ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status};

use crate::backend::{BackendError, InvalidArgument};
use crate::net::{Cidr, parse_ip};

pub const CONNECTION_CONTEXT_UPDATED: &str = "Connection Context Updated Successfully";
pub const QOS_ENFORCED: &str = "Slice QoS policy enforced successfully";
pub const INVALID_VPN_IP: &str = "Invalid Remote Slice Gateway VPN IP";
pub const INVALID_SUBNET: &str = "Invalid Remote Slice Gateway Subnet";
pub const CIDR_PARSE_ERROR: &str = "Error in Parsing CIDR";
pub const INVALID_TC_TYPE: &str = "Invalid TC type";
pub const INVALID_CLASS_TYPE: &str = "Invalid QoS class type";
pub const INVALID_BANDWIDTH: &str =
    "Invalid bandwidth: the ceiling must be set and not below the guaranteed bandwidth";
pub const INVALID_PRIORITY: &str = "Invalid priority: must be 0 to 7";
pub const INVALID_DSCP_CLASS: &str = "Invalid DSCP class";
/// The NSM interface of a gateway pod; `nsmIntfStatus` always names it.
pub const NSM_INTERFACE: &str = "nsm0";
/// Port of the peer gateway's sidecar (KubeSlice's fixed port).
pub const DEFAULT_PEER_PORT: u16 = 5000;

/// Who this gateway pod is (flags or the downward API's env vars).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIdentity {
    pub node_ip: String,
    pub pod_ip: String,
    pub pod_name: String,
}

/// A validated `UpdateConnectionContext`: route `subnet` via the remote gateway's VPN IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayRoute {
    pub subnet: Cidr,
    pub via: IpAddr,
}

pub fn validate_connection_context(
    req: &SliceGwConnectionContext,
) -> Result<GatewayRoute, InvalidArgument> {
    let via = parse_ip(&req.remote_slice_gw_vpn_ip).ok_or(InvalidArgument(INVALID_VPN_IP))?;
    if req.remote_slice_gw_nsm_subnet.is_empty() {
        return Err(InvalidArgument(INVALID_SUBNET));
    }
    let subnet: Cidr = req
        .remote_slice_gw_nsm_subnet
        .parse()
        .map_err(|_| InvalidArgument(CIDR_PARSE_ERROR))?;
    if subnet.is_ipv4() != via.is_ipv4() {
        return Err(InvalidArgument(INVALID_VPN_IP));
    }
    Ok(GatewayRoute { subnet, via })
}

/// DSCP classes accepted in `dscpClass`: the short names, empty (no marking), and
/// the `QOS_PROFILE_DSCP_CLASS_<NAME>` form KubeSlice's controller sends.
const DSCP_CLASSES: [&str; 14] = [
    "DEFAULT", "AF11", "AF12", "AF13", "AF21", "AF22", "AF23", "AF31", "AF32", "AF33", "AF41",
    "AF42", "AF43", "EF",
];
const DSCP_CONTROLLER_PREFIX: &str = "QOS_PROFILE_DSCP_CLASS_";

/// The DSCP class name (`AF11`, `EF`, `Default`) of a `dscpClass` value, if valid.
pub fn dscp_class(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        return Some("Default");
    }
    let name = value.strip_prefix(DSCP_CONTROLLER_PREFIX).unwrap_or(value);
    DSCP_CLASSES
        .iter()
        .find(|class| class.eq_ignore_ascii_case(name))
        .map(|class| {
            if *class == "DEFAULT" {
                "Default"
            } else {
                class
            }
        })
}

pub fn validate_qos(profile: &SliceQosProfile) -> Result<(), InvalidArgument> {
    TcType::try_from(profile.tc_type).map_err(|_| InvalidArgument(INVALID_TC_TYPE))?;
    ClassType::try_from(profile.class_type).map_err(|_| InvalidArgument(INVALID_CLASS_TYPE))?;
    if profile.bw_ceiling == 0 || profile.bw_guaranteed > profile.bw_ceiling {
        return Err(InvalidArgument(INVALID_BANDWIDTH));
    }
    if profile.priority > 7 {
        return Err(InvalidArgument(INVALID_PRIORITY));
    }
    if dscp_class(&profile.dscp_class).is_none() {
        return Err(InvalidArgument(INVALID_DSCP_CLASS));
    }
    Ok(())
}

/// Where the gateway's state comes from: the kernel (netlink) or this process.
#[tonic::async_trait]
pub trait GwBackend: Send + Sync + 'static {
    /// IPv4 address of `nsm0`, or "" when it has none (or does not exist).
    async fn nsm_ip(&self) -> Result<String, BackendError>;
    /// The tunnel interface and its health; DOWN when there is no tunnel.
    async fn tunnel_status(&self) -> Result<TunnelInterfaceStatus, BackendError>;
    /// Installs or replaces the route to the remote slice subnet.
    async fn route_via(&self, route: GatewayRoute) -> Result<(), BackendError>;
    /// Applies a validated QoS profile.
    async fn apply_qos(&self, profile: &SliceQosProfile) -> Result<(), BackendError>;
    /// Where the peer gateway's sidecar answers, asked for the remote VPN IP: that IP itself
    /// through the kernel's tunnel (every instance's tunnel has the same remote VPN IP and
    /// reaches its own peer); the memory backend may say otherwise.
    async fn peer_address(&self, remote_vpn_ip: IpAddr) -> IpAddr {
        remote_vpn_ip
    }
}

/// How `GetSliceGwRemotePodName` reaches the peer gateway's sidecar.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    pub port: u16,
    pub timeout: Duration,
    /// TLS towards peers (when the sidecars serve TLS).
    pub tls: Option<ClientTlsConfig>,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            port: DEFAULT_PEER_PORT,
            timeout: Duration::from_secs(5),
            tls: None,
        }
    }
}

impl PeerConfig {
    async fn get_status(&self, ip: IpAddr) -> Result<GwPodStatus, Status> {
        let addr = SocketAddr::new(ip, self.port);
        let unavailable =
            |what: String| Status::unavailable(format!("remote gateway sidecar at {addr}: {what}"));
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|error| unavailable(error.to_string()))?
            .connect_timeout(self.timeout)
            .timeout(self.timeout);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|error| unavailable(error.to_string()))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|error| unavailable(format!("connect failed: {}", error_chain(&error))))?;
        let reply = GwSidecarServiceClient::new(channel)
            .get_status(())
            .await
            .map_err(|status| {
                unavailable(format!(
                    "GetStatus failed: {:?}: {}",
                    status.code(),
                    status.message()
                ))
            })?;
        Ok(reply.into_inner())
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The gRPC service over a backend.
#[derive(Clone)]
pub struct GwSidecar {
    backend: Arc<dyn GwBackend>,
    identity: PodIdentity,
    peer: PeerConfig,
}

impl GwSidecar {
    pub fn new(backend: Arc<dyn GwBackend>, identity: PodIdentity, peer: PeerConfig) -> Self {
        Self {
            backend,
            identity,
            peer,
        }
    }

    pub fn into_server(self) -> GwSidecarServiceServer<Self> {
        GwSidecarServiceServer::new(self)
    }

    /// This pod's status, as `GetStatus` reports it.
    pub async fn status(&self) -> Result<GwPodStatus, BackendError> {
        let (nsm_ip, tunnel) = tokio::join!(self.backend.nsm_ip(), self.backend.tunnel_status());
        Ok(GwPodStatus {
            node_ip: self.identity.node_ip.clone(),
            gateway_pod_ip: self.identity.pod_ip.clone(),
            gateway_pod_name: self.identity.pod_name.clone(),
            tunnel_status: Some(tunnel?),
            nsm_intf_status: Some(NsmInterfaceStatus {
                nsm_interface_name: NSM_INTERFACE.into(),
                nsm_ip: nsm_ip?,
            }),
        })
    }
}

#[tonic::async_trait]
impl GwSidecarService for GwSidecar {
    async fn get_status(&self, _request: Request<()>) -> Result<Response<GwPodStatus>, Status> {
        Ok(Response::new(self.status().await?))
    }

    async fn get_slice_gw_remote_pod_name(
        &self,
        request: Request<RemoteGwVpnIp>,
    ) -> Result<Response<GwPodStatus>, Status> {
        let ip =
            parse_ip(&request.get_ref().remote_gw_vpn_ip).ok_or(InvalidArgument(INVALID_VPN_IP))?;
        let peer = self.backend.peer_address(ip).await;
        Ok(Response::new(self.peer.get_status(peer).await?))
    }

    async fn update_connection_context(
        &self,
        request: Request<SliceGwConnectionContext>,
    ) -> Result<Response<SidecarResponse>, Status> {
        let route = validate_connection_context(request.get_ref())?;
        let backend = self.backend.clone();
        // Runs to completion even if the caller goes away.
        tokio::spawn(async move { backend.route_via(route).await })
            .await
            .map_err(|error| Status::internal(format!("route task failed: {error}")))??;
        tracing::info!(subnet = %route.subnet, via = %route.via, "remote slice subnet routed via the remote gateway");
        Ok(Response::new(SidecarResponse {
            status_msg: CONNECTION_CONTEXT_UPDATED.into(),
        }))
    }

    async fn update_slice_qos_profile(
        &self,
        request: Request<SliceQosProfile>,
    ) -> Result<Response<SidecarResponse>, Status> {
        validate_qos(request.get_ref())?;
        self.backend.apply_qos(request.get_ref()).await?;
        Ok(Response::new(SidecarResponse {
            status_msg: QOS_ENFORCED.into(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(vpn: &str, subnet: &str) -> SliceGwConnectionContext {
        SliceGwConnectionContext {
            remote_slice_gw_vpn_ip: vpn.into(),
            remote_slice_gw_nsm_subnet: subnet.into(),
            ..Default::default()
        }
    }

    #[test]
    fn connection_context_validation_messages() {
        let invalid = |vpn: &str, subnet: &str| {
            validate_connection_context(&context(vpn, subnet))
                .expect_err("invalid")
                .0
        };
        assert_eq!(invalid("", "10.2.0.0/16"), INVALID_VPN_IP);
        assert_eq!(invalid("vpn", "10.2.0.0/16"), INVALID_VPN_IP);
        assert_eq!(invalid("10.9.0.2", ""), INVALID_SUBNET);
        assert_eq!(invalid("10.9.0.2", "10.2.0.0"), CIDR_PARSE_ERROR);
        assert_eq!(invalid("10.9.0.2", "fd00::/64"), INVALID_VPN_IP);
        let route =
            validate_connection_context(&context("10.9.0.2", "10.2.3.0/16")).expect("valid");
        assert_eq!(route.subnet.to_string(), "10.2.0.0/16");
    }

    #[test]
    fn qos_validation() {
        let valid = SliceQosProfile {
            class_type: ClassType::Htb as i32,
            bw_ceiling: 5000,
            bw_guaranteed: 1000,
            priority: 2,
            dscp_class: "AF11".into(),
            ..Default::default()
        };
        assert_eq!(validate_qos(&valid), Ok(()));
        let check = |change: fn(&mut SliceQosProfile)| {
            let mut profile = valid.clone();
            change(&mut profile);
            validate_qos(&profile).expect_err("invalid").0
        };
        assert_eq!(check(|p| p.tc_type = 7), INVALID_TC_TYPE);
        assert_eq!(check(|p| p.class_type = 2), INVALID_CLASS_TYPE);
        assert_eq!(check(|p| p.bw_ceiling = 0), INVALID_BANDWIDTH);
        assert_eq!(check(|p| p.bw_guaranteed = 6000), INVALID_BANDWIDTH);
        assert_eq!(check(|p| p.priority = 8), INVALID_PRIORITY);
        assert_eq!(check(|p| p.dscp_class = "AF99".into()), INVALID_DSCP_CLASS);
        assert_eq!(
            check(|p| p.dscp_class = "QOS_PROFILE_DSCP_CLASS_CS9".into()),
            INVALID_DSCP_CLASS
        );
    }

    #[test]
    fn dscp_classes_in_both_spellings() {
        assert_eq!(dscp_class("AF11"), Some("AF11"));
        assert_eq!(dscp_class("QOS_PROFILE_DSCP_CLASS_AF11"), Some("AF11"));
        assert_eq!(dscp_class("QOS_PROFILE_DSCP_CLASS_EF"), Some("EF"));
        assert_eq!(
            dscp_class("QOS_PROFILE_DSCP_CLASS_DEFAULT"),
            Some("Default")
        );
        assert_eq!(dscp_class("Default"), Some("Default"));
        assert_eq!(dscp_class(""), Some("Default"));
        assert_eq!(dscp_class("AF5"), None);
    }
}
