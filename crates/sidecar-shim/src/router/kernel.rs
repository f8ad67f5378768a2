//! Routes in the kernel through rtnetlink, in the process's network namespace
//! (or the one given with `--netns`). Needs CAP_NET_ADMIN.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;

use capstan_proto::router::ConnectionInfo;
use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::{RouteMessageBuilder, RouteNextHopBuilder};

use super::{NextHops, RouterBackend};
use crate::backend::BackendError;
use crate::kernel_cache::{Cached, groups};
use crate::net::Cidr;
use crate::netns::Netlink;

/// Links whose clients `GetSliceRouterClientConnectionInfo` reports.
pub const CLIENT_LINK_PREFIX: &str = "vl3-";
/// The interface name NSM gives the client side of a connection (KubeSlice reports it as is).
pub const CLIENT_NSM_INTERFACE: &str = "nsm0";

const ESRCH: i32 = 3;

/// The kernel backend.
#[derive(Debug, Clone)]
pub struct KernelRouter {
    netlink: Netlink,
    /// The main table's unicast routes per family, dumped again only after a route
    /// notification (our own writes included).
    ipv4_routes: Arc<Cached<Arc<Vec<RouteMessage>>>>,
    ipv6_routes: Arc<Cached<Arc<Vec<RouteMessage>>>>,
}

impl KernelRouter {
    /// Connects to the kernel in the namespace at `netns`, or in this process's own.
    pub fn connect(netns: Option<&Path>) -> Result<Self, BackendError> {
        Ok(Self {
            netlink: Netlink::connect(netns)?,
            ipv4_routes: Arc::new(Cached::subscribe(netns, groups::IPV4_ROUTE)?),
            ipv6_routes: Arc::new(Cached::subscribe(netns, groups::IPV6_ROUTE)?),
        })
    }

    /// Fails at start-up, naming CAP_NET_ADMIN, when the kernel would refuse route changes
    /// (see [`Netlink::require_net_admin`]).
    pub async fn require_net_admin(&self) -> Result<(), BackendError> {
        self.netlink.require_net_admin().await
    }

    async fn main_table_routes(&self, ipv4: bool) -> Result<Arc<Vec<RouteMessage>>, BackendError> {
        let cache = if ipv4 {
            &self.ipv4_routes
        } else {
            &self.ipv6_routes
        };
        cache
            .get(|| async { Ok(Arc::new(self.dump_main_table_routes(ipv4).await?)) })
            .await
    }

    async fn dump_main_table_routes(&self, ipv4: bool) -> Result<Vec<RouteMessage>, BackendError> {
        let query = if ipv4 {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        };
        let netlink = self.netlink.lock().await;
        let routes: Vec<RouteMessage> = netlink
            .handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await?;
        Ok(routes
            .into_iter()
            .filter(|route| route_table(route) == u32::from(RouteHeader::RT_TABLE_MAIN))
            .filter(|route| route.header.kind == RouteType::Unicast)
            .collect())
    }
}

fn route_table(route: &RouteMessage) -> u32 {
    route
        .attributes
        .iter()
        .find_map(|attr| match attr {
            RouteAttribute::Table(table) => Some(*table),
            _ => None,
        })
        .unwrap_or(u32::from(route.header.table))
}

fn route_destination(route: &RouteMessage) -> Option<Cidr> {
    let len = route.header.destination_prefix_length;
    let addr = route.attributes.iter().find_map(|attr| match attr {
        RouteAttribute::Destination(address) => route_ip(address),
        _ => None,
    });
    match addr {
        Some(addr) => Cidr::new(addr, len).ok(),
        // The default route carries no destination attribute.
        None if len == 0 => {
            let any = match route.header.address_family {
                rtnetlink::packet_route::AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            };
            Cidr::new(any, 0).ok()
        }
        None => None,
    }
}

fn route_ip(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Gateways of a route: a single `RTA_GATEWAY` (the kernel's form of a one-hop route)
/// or every hop of `RTA_MULTIPATH`.
fn route_gateways(route: &RouteMessage) -> NextHops {
    let mut hops = NextHops::new();
    for attr in &route.attributes {
        match attr {
            RouteAttribute::Gateway(address) => hops.extend(route_ip(address)),
            RouteAttribute::MultiPath(next_hops) => {
                for hop in next_hops {
                    for attr in &hop.attributes {
                        if let RouteAttribute::Gateway(address) = attr {
                            hops.extend(route_ip(address));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    hops
}

pub(crate) fn route_message(dst: Cidr) -> Result<RouteMessage, BackendError> {
    let builder = rtnetlink::RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.network(), dst.prefix_len())
        .map_err(|error| BackendError::Kernel(error.to_string()))?;
    Ok(builder.build())
}

#[tonic::async_trait]
impl RouterBackend for KernelRouter {
    async fn next_hops(&self, dst: Cidr) -> Result<Option<NextHops>, BackendError> {
        let routes = self.main_table_routes(dst.is_ipv4()).await?;
        let mut found: Option<NextHops> = None;
        for route in routes
            .iter()
            .filter(|route| route_destination(route) == Some(dst))
        {
            found
                .get_or_insert_with(NextHops::new)
                .extend(route_gateways(route));
        }
        Ok(found)
    }

    async fn replace_route(&self, dst: Cidr, next_hops: &NextHops) -> Result<(), BackendError> {
        let mut hops = Vec::with_capacity(next_hops.len());
        for ip in next_hops {
            let builder = if ip.is_ipv4() {
                RouteNextHopBuilder::new_ipv4()
            } else {
                RouteNextHopBuilder::new_ipv6()
            };
            // No interface: the kernel picks the link that reaches each gateway.
            let hop = builder
                .via(*ip)
                .map_err(|error| BackendError::Kernel(error.to_string()))?
                .build();
            hops.push(hop);
        }
        let mut message = route_message(dst)?;
        message.attributes.push(RouteAttribute::MultiPath(hops));
        let netlink = self.netlink.lock().await;
        netlink
            .handle
            .route()
            .add(message)
            .replace()
            .execute()
            .await
            .map_err(|error| {
                BackendError::Kernel(format!("replace route to {dst} via {next_hops:?}: {error}"))
            })
    }

    async fn delete_route(&self, dst: Cidr) -> Result<(), BackendError> {
        // A route may exist more than once (different metrics); delete until none is left.
        let netlink = self.netlink.lock().await;
        for _ in 0..16 {
            let mut message = route_message(dst)?;
            // Match any protocol and scope, like `ip route del`.
            message.header.protocol = RouteProtocol::Unspec;
            message.header.scope = RouteScope::NoWhere;
            match netlink.handle.route().del(message).execute().await {
                Ok(()) => continue,
                Err(rtnetlink::Error::NetlinkError(error)) if error.raw_code().abs() == ESRCH => {
                    return Ok(());
                }
                Err(error) => {
                    return Err(BackendError::Kernel(format!(
                        "delete route to {dst}: {error}"
                    )));
                }
            }
        }
        Err(BackendError::Kernel(format!(
            "route to {dst} keeps reappearing"
        )))
    }

    async fn connections(&self) -> Result<Vec<ConnectionInfo>, BackendError> {
        let netlink = self.netlink.lock().await;
        let links: Vec<LinkMessage> = netlink.handle.link().get().execute().try_collect().await?;
        let mut connections = Vec::new();
        for link in links {
            let mut name = None;
            let mut alias = None;
            for attr in &link.attributes {
                match attr {
                    LinkAttribute::IfName(value) => name = Some(value.clone()),
                    LinkAttribute::IfAlias(value) => alias = Some(value.clone()),
                    _ => {}
                }
            }
            let Some(name) = name.filter(|name| name.starts_with(CLIENT_LINK_PREFIX)) else {
                continue;
            };
            let addresses: Vec<AddressMessage> = netlink
                .handle
                .address()
                .get()
                .set_link_index_filter(link.header.index)
                .execute()
                .try_collect()
                .await?;
            let v4: Vec<LinkAddress> = addresses.iter().filter_map(link_address_v4).collect();
            if let Some(connection) = client_connection(&name, alias.as_deref(), &v4) {
                connections.push(connection);
            }
        }
        connections.sort_by(|a, b| a.pod_name.cmp(&b.pod_name));
        Ok(connections)
    }
}

/// One IPv4 address of a link: local, the peer of a point-to-point address, prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkAddress {
    pub local: Ipv4Addr,
    pub peer: Option<Ipv4Addr>,
    pub prefix_len: u8,
}

pub(crate) fn link_address_v4(message: &AddressMessage) -> Option<LinkAddress> {
    let mut local = None;
    let mut address = None;
    for attr in &message.attributes {
        match attr {
            AddressAttribute::Local(IpAddr::V4(v4)) => local = Some(*v4),
            AddressAttribute::Address(IpAddr::V4(v4)) => address = Some(*v4),
            _ => {}
        }
    }
    let local = local.or(address)?;
    Some(LinkAddress {
        local,
        peer: address.filter(|peer| *peer != local),
        prefix_len: message.header.prefix_len,
    })
}

/// The client behind a `vl3-*` link. The link holds the router's end of the NSM
/// connection (`nsmPeerIP`); the client's end (`nsmIP`) is the point-to-point peer,
/// or the other host of a /30 or /31. Links without exactly one IPv4 address are
/// skipped, as KubeSlice does.
pub fn client_connection(
    link_name: &str,
    alias: Option<&str>,
    addresses: &[LinkAddress],
) -> Option<ConnectionInfo> {
    let [address] = addresses else {
        return None;
    };
    let client = address
        .peer
        .or_else(|| other_host(address.local, address.prefix_len));
    Some(ConnectionInfo {
        pod_name: alias
            .filter(|a| !a.is_empty())
            .unwrap_or(link_name)
            .to_owned(),
        nsm_interface: CLIENT_NSM_INTERFACE.to_owned(),
        nsm_ip: client.map(|ip| ip.to_string()).unwrap_or_default(),
        nsm_peer_ip: address.local.to_string(),
    })
}

fn other_host(local: Ipv4Addr, prefix_len: u8) -> Option<Ipv4Addr> {
    let bits = u32::from(local);
    match prefix_len {
        31 => Some(Ipv4Addr::from(bits ^ 1)),
        30 => {
            let network = bits & !3;
            // Usable hosts of a /30 are .1 and .2 of the block.
            match bits - network {
                1 => Some(Ipv4Addr::from(network + 2)),
                2 => Some(Ipv4Addr::from(network + 1)),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(local: &str, peer: Option<&str>, prefix_len: u8) -> LinkAddress {
        LinkAddress {
            local: local.parse().expect("ip"),
            peer: peer.map(|p| p.parse().expect("ip")),
            prefix_len,
        }
    }

    #[test]
    fn client_of_a_slash_30_like_kubeslice() {
        // KubeSlice: client = broadcast - 2, router = broadcast - 1.
        let conn = client_connection("vl3-abc", Some("app-pod"), &[addr("10.1.2.2", None, 30)])
            .expect("connection");
        assert_eq!(conn.pod_name, "app-pod");
        assert_eq!(conn.nsm_interface, "nsm0");
        assert_eq!(conn.nsm_ip, "10.1.2.1");
        assert_eq!(conn.nsm_peer_ip, "10.1.2.2");
    }

    #[test]
    fn client_of_point_to_point_and_slash_31() {
        let p2p = client_connection("vl3-x", None, &[addr("10.1.3.1", Some("10.1.3.9"), 32)])
            .expect("connection");
        assert_eq!(
            (p2p.pod_name.as_str(), p2p.nsm_ip.as_str()),
            ("vl3-x", "10.1.3.9")
        );
        let s31 = client_connection("vl3-y", Some(""), &[addr("10.1.4.0", None, 31)])
            .expect("connection");
        assert_eq!(
            (s31.pod_name.as_str(), s31.nsm_ip.as_str()),
            ("vl3-y", "10.1.4.1")
        );
        let wide = client_connection("vl3-z", None, &[addr("10.1.5.7", None, 24)]).expect("c");
        assert_eq!(wide.nsm_ip, "");
    }

    #[test]
    fn links_without_exactly_one_address_are_skipped() {
        assert!(client_connection("vl3-a", None, &[]).is_none());
        let two = [addr("10.1.2.2", None, 30), addr("10.1.6.2", None, 30)];
        assert!(client_connection("vl3-a", None, &two).is_none());
    }
}
