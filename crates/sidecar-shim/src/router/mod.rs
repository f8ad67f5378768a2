//! `router.SliceRouterSidecarService`: ECMP routes from the slice router to
//! remote slice subnets, one next hop per slice gateway.
//!
//! Requests are validated first ([`validate_context`], [`validate_route_query`],
//! [`validate_ecmp_removal`]); the change to make is computed by pure planning
//! ([`plan_next_hops`], [`plan_removal`]); only then does a [`RouterBackend`]
//! touch routes, so an invalid request never changes anything.

pub mod kernel;
pub mod memory;
pub mod writer;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use capstan_proto::router::{
    ClientConnectionInfo, ConnectionInfo, EcmpUpdateInfo, SidecarResponse, SliceGwConContext,
    VerifyRouteAddRequest, VerifyRouteAddResponse,
    slice_router_sidecar_service_server::{
        SliceRouterSidecarService, SliceRouterSidecarServiceServer,
    },
};
use tonic::{Request, Response, Status};

use crate::backend::{BackendError, InvalidArgument};
use crate::net::{Cidr, parse_ip};

pub const CONTEXT_UPDATED: &str = "Slice Gw Connection Context Updated Successfully";
pub const ECMP_UPDATED: &str = "Ecmp routes Updated Successfully";
pub const INVALID_SUBNET: &str = "Invalid Remote Slice Gateway Subnet";
pub const INVALID_NSM_IP: &str = "Invalid NSM IP";
pub const INVALID_NSM_IP_TO_REMOVE: &str = "Invalid Nsm ip has been provided";
pub const INVALID_PEER_IP: &str = "Invalid Local NSM Gateway Peer IP";

/// The next hops of one ECMP route, ordered so that equal sets compare equal.
pub type NextHops = BTreeSet<IpAddr>;

/// A validated `UpdateSliceGwConnectionContext`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextUpdate {
    pub subnet: Cidr,
    /// Empty: remove the route.
    pub next_hops: NextHops,
}

/// A validated `GetRouteInKernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteQuery {
    pub dst: Cidr,
    pub nsm_ip: IpAddr,
}

/// A validated `UpdateEcmpRoutes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EcmpRemoval {
    pub subnet: Cidr,
    pub nsm_ip: IpAddr,
}

/// What to do to the route of one subnet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteChange {
    /// Already as desired: no kernel call.
    Keep,
    /// Install, or replace atomically, with exactly these next hops.
    Replace(NextHops),
    Remove,
}

pub fn validate_context(req: &SliceGwConContext) -> Result<ContextUpdate, InvalidArgument> {
    let subnet = parse_subnet(&req.remote_slice_gw_nsm_subnet)?;
    let mut next_hops = NextHops::new();
    for text in &req.local_nsm_gw_peer_ip_list {
        let ip = parse_ip(text)
            .filter(|ip| ip.is_ipv4() == subnet.is_ipv4())
            .ok_or(InvalidArgument(INVALID_PEER_IP))?;
        next_hops.insert(ip);
    }
    Ok(ContextUpdate { subnet, next_hops })
}

/// `dstIP` is the remote subnet (a bare address reads as a host route).
pub fn validate_route_query(req: &VerifyRouteAddRequest) -> Result<RouteQuery, InvalidArgument> {
    if req.dst_ip.is_empty() {
        return Err(InvalidArgument(INVALID_SUBNET));
    }
    if req.nsm_ip.is_empty() {
        return Err(InvalidArgument(INVALID_NSM_IP));
    }
    let dst =
        Cidr::parse_prefix_or_host(&req.dst_ip).map_err(|_| InvalidArgument(INVALID_SUBNET))?;
    let nsm_ip = parse_ip(&req.nsm_ip).ok_or(InvalidArgument(INVALID_NSM_IP))?;
    Ok(RouteQuery { dst, nsm_ip })
}

pub fn validate_ecmp_removal(req: &EcmpUpdateInfo) -> Result<EcmpRemoval, InvalidArgument> {
    let subnet = parse_subnet(&req.remote_slice_gw_nsm_subnet)?;
    let nsm_ip =
        parse_ip(&req.nsm_ip_to_remove).ok_or(InvalidArgument(INVALID_NSM_IP_TO_REMOVE))?;
    Ok(EcmpRemoval { subnet, nsm_ip })
}

fn parse_subnet(text: &str) -> Result<Cidr, InvalidArgument> {
    text.parse().map_err(|_| InvalidArgument(INVALID_SUBNET))
}

/// The change that makes the route's next hops exactly `desired` (empty: no route).
pub fn plan_next_hops(current: Option<&NextHops>, desired: &NextHops) -> RouteChange {
    match current {
        None if desired.is_empty() => RouteChange::Keep,
        Some(_) if desired.is_empty() => RouteChange::Remove,
        Some(current) if current == desired => RouteChange::Keep,
        _ => RouteChange::Replace(desired.clone()),
    }
}

/// The change that drops `remove` from the route's next hops; the last one takes the route.
pub fn plan_removal(current: Option<&NextHops>, remove: IpAddr) -> RouteChange {
    match current {
        Some(current) if current.contains(&remove) => {
            let mut rest = current.clone();
            rest.remove(&remove);
            if rest.is_empty() {
                RouteChange::Remove
            } else {
                RouteChange::Replace(rest)
            }
        }
        _ => RouteChange::Keep,
    }
}

/// Where routes live: the kernel (netlink) or a table in this process.
#[tonic::async_trait]
pub trait RouterBackend: Send + Sync + 'static {
    /// Next hops of the route to exactly `dst` in the main table; `None` when there is none.
    async fn next_hops(&self, dst: Cidr) -> Result<Option<NextHops>, BackendError>;
    /// Installs or atomically replaces the route to `dst` (`next_hops` is not empty).
    async fn replace_route(&self, dst: Cidr, next_hops: &NextHops) -> Result<(), BackendError>;
    /// Removes the route to `dst`; an absent route is not an error.
    async fn delete_route(&self, dst: Cidr) -> Result<(), BackendError>;
    /// One entry per client connected to the slice router.
    async fn connections(&self) -> Result<Vec<ConnectionInfo>, BackendError>;
}

async fn apply(
    backend: &dyn RouterBackend,
    dst: Cidr,
    change: RouteChange,
) -> Result<(), BackendError> {
    match change {
        RouteChange::Keep => Ok(()),
        RouteChange::Replace(next_hops) => backend.replace_route(dst, &next_hops).await,
        RouteChange::Remove => backend.delete_route(dst).await,
    }
}

/// The gRPC service over a backend.
#[derive(Clone)]
pub struct RouterSidecar {
    backend: Arc<dyn RouterBackend>,
    /// Route changes go through one writer, in arrival order (see [`writer`]).
    writer: writer::RouteWriter,
}

impl RouterSidecar {
    pub fn new(backend: Arc<dyn RouterBackend>) -> Self {
        Self {
            writer: writer::RouteWriter::new(backend.clone()),
            backend,
        }
    }

    pub fn into_server(self) -> SliceRouterSidecarServiceServer<Self> {
        SliceRouterSidecarServiceServer::new(self)
    }

    /// Plans and applies a change to the route to `dst` through the writer.
    async fn change_route<F>(&self, dst: Cidr, plan: F) -> Result<RouteChange, Status>
    where
        F: FnOnce(Option<&NextHops>) -> RouteChange + Send + 'static,
    {
        self.writer.change(dst, Box::new(plan)).await
    }
}

#[tonic::async_trait]
impl SliceRouterSidecarService for RouterSidecar {
    async fn update_slice_gw_connection_context(
        &self,
        request: Request<SliceGwConContext>,
    ) -> Result<Response<SidecarResponse>, Status> {
        let update = validate_context(request.get_ref())?;
        let desired = update.next_hops.clone();
        let change = self
            .change_route(update.subnet, move |current| {
                plan_next_hops(current, &desired)
            })
            .await?;
        tracing::info!(subnet = %update.subnet, next_hops = ?update.next_hops, ?change, "slice gateway connection context applied");
        Ok(Response::new(SidecarResponse {
            status_msg: CONTEXT_UPDATED.into(),
        }))
    }

    async fn get_slice_router_client_connection_info(
        &self,
        _request: Request<()>,
    ) -> Result<Response<ClientConnectionInfo>, Status> {
        let connection = self.backend.connections().await?;
        Ok(Response::new(ClientConnectionInfo { connection }))
    }

    async fn get_route_in_kernel(
        &self,
        request: Request<VerifyRouteAddRequest>,
    ) -> Result<Response<VerifyRouteAddResponse>, Status> {
        let query = validate_route_query(request.get_ref())?;
        let next_hops = self.backend.next_hops(query.dst).await?;
        let is_route_present = next_hops.is_some_and(|hops| hops.contains(&query.nsm_ip));
        Ok(Response::new(VerifyRouteAddResponse { is_route_present }))
    }

    async fn update_ecmp_routes(
        &self,
        request: Request<EcmpUpdateInfo>,
    ) -> Result<Response<SidecarResponse>, Status> {
        let removal = validate_ecmp_removal(request.get_ref())?;
        let change = self
            .change_route(removal.subnet, move |current| {
                plan_removal(current, removal.nsm_ip)
            })
            .await?;
        tracing::info!(subnet = %removal.subnet, removed = %removal.nsm_ip, ?change, "ECMP next hop removed");
        Ok(Response::new(SidecarResponse {
            status_msg: ECMP_UPDATED.into(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hops(ips: &[&str]) -> NextHops {
        ips.iter().map(|ip| ip.parse().expect("ip")).collect()
    }

    fn ctx(subnet: &str, ips: &[&str]) -> SliceGwConContext {
        SliceGwConContext {
            remote_slice_gw_nsm_subnet: subnet.into(),
            local_nsm_gw_peer_ip_list: ips.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn context_validation_messages() {
        let invalid = |req: &SliceGwConContext| validate_context(req).expect_err("invalid").0;
        assert_eq!(invalid(&ctx("", &["10.1.1.2"])), INVALID_SUBNET);
        assert_eq!(invalid(&ctx("10.2.0.0", &["10.1.1.2"])), INVALID_SUBNET);
        assert_eq!(invalid(&ctx("10.2.0.0/40", &[])), INVALID_SUBNET);
        assert_eq!(invalid(&ctx("10.2.0.0/16", &["10.1.1"])), INVALID_PEER_IP);
        assert_eq!(
            invalid(&ctx("10.2.0.0/16", &["10.1.1.2", ""])),
            INVALID_PEER_IP
        );
        assert_eq!(invalid(&ctx("10.2.0.0/16", &["fd00::1"])), INVALID_PEER_IP);
    }

    #[test]
    fn context_is_canonicalised() {
        let update = validate_context(&ctx("10.2.3.4/16", &["10.1.1.3", "10.1.1.2", "10.1.1.3"]))
            .expect("valid");
        assert_eq!(update.subnet.to_string(), "10.2.0.0/16");
        assert_eq!(update.next_hops, hops(&["10.1.1.2", "10.1.1.3"]));
        let empty = validate_context(&ctx("10.2.0.0/16", &[])).expect("valid");
        assert!(empty.next_hops.is_empty());
    }

    #[test]
    fn route_query_validation_order_and_messages() {
        let query = |dst: &str, nsm: &str| {
            validate_route_query(&VerifyRouteAddRequest {
                dst_ip: dst.into(),
                nsm_ip: nsm.into(),
            })
        };
        assert_eq!(query("", "").expect_err("invalid").0, INVALID_SUBNET);
        assert_eq!(
            query("10.2.0.0/16", "").expect_err("invalid").0,
            INVALID_NSM_IP
        );
        assert_eq!(
            query("bogus", "10.1.1.2").expect_err("invalid").0,
            INVALID_SUBNET
        );
        assert_eq!(
            query("10.2.0.0/16", "bogus").expect_err("invalid").0,
            INVALID_NSM_IP
        );
        let ok = query("10.2.0.0/16", "10.1.1.2").expect("valid");
        assert_eq!(ok.dst.to_string(), "10.2.0.0/16");
    }

    #[test]
    fn ecmp_removal_validation_messages() {
        let removal = |subnet: &str, nsm: &str| {
            validate_ecmp_removal(&EcmpUpdateInfo {
                remote_slice_gw_nsm_subnet: subnet.into(),
                nsm_ip_to_remove: nsm.into(),
            })
        };
        assert_eq!(
            removal("", "10.1.1.2").expect_err("invalid").0,
            INVALID_SUBNET
        );
        assert_eq!(
            removal("10.2.0.0/16", "").expect_err("invalid").0,
            INVALID_NSM_IP_TO_REMOVE
        );
        assert_eq!(
            removal("10.2.0.0/16", "x").expect_err("invalid").0,
            INVALID_NSM_IP_TO_REMOVE
        );
        assert!(removal("10.2.0.0/16", "10.1.1.2").is_ok());
    }

    #[test]
    fn planning_next_hops() {
        let a = hops(&["10.1.1.2"]);
        let ab = hops(&["10.1.1.2", "10.1.1.3"]);
        let none = NextHops::new();
        assert_eq!(plan_next_hops(None, &ab), RouteChange::Replace(ab.clone()));
        assert_eq!(plan_next_hops(Some(&ab), &ab), RouteChange::Keep);
        assert_eq!(
            plan_next_hops(Some(&ab), &a),
            RouteChange::Replace(a.clone())
        );
        assert_eq!(plan_next_hops(Some(&a), &none), RouteChange::Remove);
        assert_eq!(plan_next_hops(None, &none), RouteChange::Keep);
    }

    #[test]
    fn planning_removal() {
        let ab = hops(&["10.1.1.2", "10.1.1.3"]);
        let a = hops(&["10.1.1.2"]);
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(
            plan_removal(Some(&ab), ip("10.1.1.3")),
            RouteChange::Replace(a.clone())
        );
        assert_eq!(plan_removal(Some(&a), ip("10.1.1.2")), RouteChange::Remove);
        assert_eq!(plan_removal(Some(&a), ip("10.1.1.9")), RouteChange::Keep);
        assert_eq!(plan_removal(None, ip("10.1.1.2")), RouteChange::Keep);
    }
}
