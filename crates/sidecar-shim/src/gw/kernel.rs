//! Gateway state from the kernel through rtnetlink: the IPv4 address of `nsm0`,
//! the first `tun*` interface and its counters (sampled by a monitor task, see
//! [`super::tunnel`]), and the route to the remote slice subnet.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use capstan_proto::sidecar::{SliceQosProfile, TunnelInterfaceStatus, TunnelStatusType};
use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_route::address::AddressMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute};

use super::tunnel::{Counters, TunnelHealth, TunnelTracker};
use super::{GatewayRoute, GwBackend, NSM_INTERFACE};
use crate::backend::BackendError;
use crate::netns::Netlink;
use crate::router::kernel::{LinkAddress, link_address_v4, route_message};

/// Interfaces whose name starts with this are tunnel interfaces.
pub const TUNNEL_PREFIX: &str = "tun";

/// The kernel backend. Dropping it stops its monitor task.
#[derive(Debug)]
pub struct KernelGw {
    netlink: Netlink,
    tracker: Arc<Mutex<TunnelTracker>>,
    monitor: tokio::task::JoinHandle<()>,
}

impl Drop for KernelGw {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

struct TunnelLink {
    name: String,
    index: u32,
    counters: Counters,
}

impl KernelGw {
    /// Connects to the kernel (in the namespace at `netns`, or this process's own) and
    /// starts checking the tunnel every `check_interval`.
    pub fn connect(netns: Option<&Path>, check_interval: Duration) -> Result<Self, BackendError> {
        let netlink = Netlink::connect(netns)?;
        let tracker = Arc::new(Mutex::new(TunnelTracker::new()));
        let monitor = tokio::spawn(monitor(netlink.clone(), tracker.clone(), check_interval));
        Ok(Self {
            netlink,
            tracker,
            monitor,
        })
    }

    fn health_of(&self, interface: &str) -> TunnelHealth {
        let tracker = self.tracker.lock().unwrap_or_else(PoisonError::into_inner);
        if tracker.interface() == Some(interface) {
            tracker.health()
        } else {
            TunnelHealth::default()
        }
    }
}

async fn links(handle: &Handle) -> Result<Vec<LinkMessage>, BackendError> {
    Ok(handle.link().get().execute().try_collect().await?)
}

fn link_name(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|attr| match attr {
        LinkAttribute::IfName(name) => Some(name.as_str()),
        _ => None,
    })
}

async fn addresses(handle: &Handle, index: u32) -> Result<Vec<LinkAddress>, BackendError> {
    let messages: Vec<AddressMessage> = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await?;
    Ok(messages.iter().filter_map(link_address_v4).collect())
}

/// The first `tun*` link by name, with its counters.
async fn tunnel_link(handle: &Handle) -> Result<Option<TunnelLink>, BackendError> {
    let mut tunnels: Vec<TunnelLink> = links(handle)
        .await?
        .iter()
        .filter_map(|link| {
            let name = link_name(link).filter(|name| name.starts_with(TUNNEL_PREFIX))?;
            let counters = link
                .attributes
                .iter()
                .find_map(|attr| match attr {
                    LinkAttribute::Stats64(stats) => Some(Counters {
                        tx_packets: stats.tx_packets,
                        rx_packets: stats.rx_packets,
                        tx_bytes: stats.tx_bytes,
                        rx_bytes: stats.rx_bytes,
                    }),
                    _ => None,
                })
                .unwrap_or_default();
            Some(TunnelLink {
                name: name.to_owned(),
                index: link.header.index,
                counters,
            })
        })
        .collect();
    tunnels.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(tunnels.into_iter().next())
}

async fn monitor(netlink: Netlink, tracker: Arc<Mutex<TunnelTracker>>, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let sample = tunnel_link(netlink.lock().await.handle).await;
        let mut tracker = tracker.lock().unwrap_or_else(PoisonError::into_inner);
        match sample {
            Ok(Some(link)) => {
                let health = tracker.observe(&link.name, link.counters, Instant::now());
                tracing::trace!(interface = %link.name, ?health, "tunnel checked");
            }
            Ok(None) => tracker.missing(),
            Err(error) => tracing::warn!(%error, "tunnel check failed"),
        }
    }
}

#[tonic::async_trait]
impl GwBackend for KernelGw {
    async fn nsm_ip(&self) -> Result<String, BackendError> {
        let netlink = self.netlink.lock().await;
        let links = links(netlink.handle).await?;
        let Some(nsm) = links
            .iter()
            .find(|link| link_name(link) == Some(NSM_INTERFACE))
        else {
            return Ok(String::new());
        };
        let addresses = addresses(netlink.handle, nsm.header.index).await?;
        Ok(addresses
            .first()
            .map(|a| a.local.to_string())
            .unwrap_or_default())
    }

    async fn tunnel_status(&self) -> Result<TunnelInterfaceStatus, BackendError> {
        let netlink = self.netlink.lock().await;
        let Some(link) = tunnel_link(netlink.handle).await? else {
            return Ok(TunnelInterfaceStatus {
                status: TunnelStatusType::GwTunnelStateDown as i32,
                ..Default::default()
            });
        };
        let address = addresses(netlink.handle, link.index)
            .await?
            .into_iter()
            .next();
        let health = self.health_of(&link.name);
        Ok(TunnelInterfaceStatus {
            net_interface: link.name,
            local_ip: address.map(|a| a.local.to_string()).unwrap_or_default(),
            peer_ip: address
                .and_then(|a| a.peer)
                .map(|p| p.to_string())
                .unwrap_or_default(),
            // Latency needs active probing, which this backend does not do.
            latency: 0,
            tx_rate: health.tx_rate,
            rx_rate: health.rx_rate,
            packet_loss: health.packet_loss,
            status: if health.is_down() {
                TunnelStatusType::GwTunnelStateDown
            } else {
                TunnelStatusType::GwTunnelStateUp
            } as i32,
        })
    }

    async fn route_via(&self, route: GatewayRoute) -> Result<(), BackendError> {
        let mut message = route_message(route.subnet)?;
        message
            .attributes
            .push(RouteAttribute::Gateway(RouteAddress::from(route.via)));
        let netlink = self.netlink.lock().await;
        netlink
            .handle
            .route()
            .add(message)
            .replace()
            .execute()
            .await
            .map_err(|error| {
                BackendError::Kernel(format!("route {} via {}: {error}", route.subnet, route.via))
            })
    }

    async fn apply_qos(&self, _profile: &SliceQosProfile) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(
            "QoS enforcement (tc HTB/TBF) is not implemented by the kernel backend yet".into(),
        ))
    }
}
