//! Gateway state from the kernel through rtnetlink: the IPv4 address of `nsm0`,
//! the first `tun*` interface and its counters (sampled by a monitor task, see
//! [`super::tunnel`]), the route to the remote slice subnet, and QoS with `tc`
//! (TBF or HTB on the tunnel interface; DSCP marking is not done).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use capstan_proto::sidecar::{ClassType, SliceQosProfile, TunnelInterfaceStatus, TunnelStatusType};
use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_route::address::AddressMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute};

use super::tunnel::{Counters, TunnelHealth, TunnelTracker};
use super::{GatewayRoute, GwBackend, NSM_INTERFACE};
use crate::backend::BackendError;
use crate::kernel_cache::{Cached, groups};
use crate::netns::Netlink;
use crate::router::kernel::{link_address_v4, route_message};

/// Interfaces whose name starts with this are tunnel interfaces.
pub const TUNNEL_PREFIX: &str = "tun";

/// The kernel backend. Dropping it stops its monitor task.
#[derive(Debug)]
pub struct KernelGw {
    netlink: Netlink,
    /// Where `tc` runs (`nsenter --net=PATH`), when not in this process's namespace.
    netns: Option<PathBuf>,
    tracker: Arc<Mutex<TunnelTracker>>,
    monitor: tokio::task::JoinHandle<()>,
    /// What `GetStatus` reads of links and addresses, dumped again only after a link or address
    /// notification (the counters come from the monitor, not from here).
    links: Cached<LinkState>,
}

impl Drop for KernelGw {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

/// The `nsm0` address and the tunnel interface with its address, as one dump saw them.
#[derive(Debug, Clone, Default)]
struct LinkState {
    nsm_ip: String,
    tunnel: Option<TunnelAddress>,
}

#[derive(Debug, Clone)]
struct TunnelAddress {
    name: String,
    local_ip: String,
    peer_ip: String,
}

/// One link dump and one address dump.
async fn link_state(handle: &Handle) -> Result<LinkState, BackendError> {
    let links = links(handle).await?;
    let nsm = links
        .iter()
        .find(|link| link_name(link) == Some(NSM_INTERFACE))
        .map(|link| link.header.index);
    let tunnel = links
        .iter()
        .filter_map(|link| {
            let name = link_name(link).filter(|name| name.starts_with(TUNNEL_PREFIX))?;
            Some((name, link.header.index))
        })
        .min_by(|a, b| a.0.cmp(b.0));
    if nsm.is_none() && tunnel.is_none() {
        return Ok(LinkState::default());
    }
    let messages: Vec<AddressMessage> = handle.address().get().execute().try_collect().await?;
    // The first IPv4 address of a link, in the kernel's order (as a filtered dump gives it).
    let first_address = |index: u32| {
        messages
            .iter()
            .filter(|message| message.header.index == index)
            .find_map(link_address_v4)
    };
    Ok(LinkState {
        nsm_ip: nsm
            .and_then(first_address)
            .map(|a| a.local.to_string())
            .unwrap_or_default(),
        tunnel: tunnel.map(|(name, index)| {
            let address = first_address(index);
            TunnelAddress {
                name: name.to_owned(),
                local_ip: address.map(|a| a.local.to_string()).unwrap_or_default(),
                peer_ip: address
                    .and_then(|a| a.peer)
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
            }
        }),
    })
}

struct TunnelLink {
    name: String,
    counters: Counters,
}

impl KernelGw {
    /// Connects to the kernel (in the namespace at `netns`, or this process's own) and
    /// starts checking the tunnel every `check_interval`.
    pub fn connect(netns: Option<&Path>, check_interval: Duration) -> Result<Self, BackendError> {
        let netlink = Netlink::connect(netns)?;
        let tracker = Arc::new(Mutex::new(TunnelTracker::new()));
        let links = Cached::subscribe(netns, groups::LINK | groups::IPV4_IFADDR)?;
        let monitor = tokio::spawn(monitor(netlink.clone(), tracker.clone(), check_interval));
        Ok(Self {
            netlink,
            netns: netns.map(Path::to_path_buf),
            tracker,
            monitor,
            links,
        })
    }

    /// Fails at start-up, naming CAP_NET_ADMIN, when the kernel would refuse route and QoS
    /// changes (see [`Netlink::require_net_admin`]).
    pub async fn require_net_admin(&self) -> Result<(), BackendError> {
        self.netlink.require_net_admin().await
    }

    async fn link_state(&self) -> Result<LinkState, BackendError> {
        self.links
            .get(|| async {
                let netlink = self.netlink.lock().await;
                link_state(netlink.handle).await
            })
            .await
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
        Ok(self.link_state().await?.nsm_ip)
    }

    async fn tunnel_status(&self) -> Result<TunnelInterfaceStatus, BackendError> {
        let Some(tunnel) = self.link_state().await?.tunnel else {
            return Ok(TunnelInterfaceStatus {
                status: TunnelStatusType::GwTunnelStateDown as i32,
                ..Default::default()
            });
        };
        let health = self.health_of(&tunnel.name);
        Ok(TunnelInterfaceStatus {
            net_interface: tunnel.name,
            local_ip: tunnel.local_ip,
            peer_ip: tunnel.peer_ip,
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

    async fn apply_qos(&self, profile: &SliceQosProfile) -> Result<(), BackendError> {
        let interface = {
            let netlink = self.netlink.lock().await;
            tunnel_link(netlink.handle).await?.map(|link| link.name)
        };
        let interface = interface.ok_or_else(|| {
            BackendError::Kernel("no tun* interface to apply the QoS profile to".into())
        })?;
        let current = root_qdisc(self.netns.as_deref(), &interface).await?;
        for args in tc_commands(&interface, profile, current.as_ref()) {
            run_tc(self.netns.as_deref(), &args).await?;
        }
        tracing::info!(%interface, class = ?ClassType::try_from(profile.class_type), ceiling_kbit = profile.bw_ceiling, "QoS applied");
        Ok(())
    }
}

/// The root qdisc of an interface, as `tc -j qdisc show` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootQdisc {
    pub kind: String,
    pub handle: String,
}

fn command(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

/// The `tc` invocations that shape `interface` as `profile` says (validated), with
/// `replace` so that applying the same profile twice changes nothing. Rates are
/// kbit/s, as in KubeSlice. TBF limits to the ceiling (KubeSlice's command); HTB
/// guarantees `bwGuaranteed` (or the ceiling when 0) and borrows up to the ceiling.
/// An HTB root already in place is kept: the kernel cannot "replace" it in place.
pub fn tc_commands(
    interface: &str,
    profile: &SliceQosProfile,
    current: Option<&RootQdisc>,
) -> Vec<Vec<String>> {
    let ceiling = format!("{}kbit", profile.bw_ceiling);
    if ClassType::try_from(profile.class_type) != Ok(ClassType::Htb) {
        return vec![command(&[
            "qdisc", "replace", "dev", interface, "root", "tbf", "rate", &ceiling, "burst",
            "32kbit", "latency", "500ms",
        ])];
    }
    let guaranteed = if profile.bw_guaranteed == 0 {
        ceiling.clone()
    } else {
        format!("{}kbit", profile.bw_guaranteed)
    };
    let priority = profile.priority.to_string();
    let htb_root_in_place = current.is_some_and(|root| root.kind == "htb" && root.handle == "1:");
    let mut commands = Vec::new();
    if !htb_root_in_place {
        commands.push(command(&[
            "qdisc", "replace", "dev", interface, "root", "handle", "1:", "htb", "default", "1",
        ]));
    }
    commands.push(command(&[
        "class",
        "replace",
        "dev",
        interface,
        "parent",
        "1:",
        "classid",
        "1:1",
        "htb",
        "rate",
        &guaranteed,
        "ceil",
        &ceiling,
        "prio",
        &priority,
    ]));
    commands
}

async fn root_qdisc(
    netns: Option<&Path>,
    interface: &str,
) -> Result<Option<RootQdisc>, BackendError> {
    let json = run_tc(netns, &command(&["-j", "qdisc", "show", "dev", interface])).await?;
    Ok(parse_root_qdisc(&json))
}

fn parse_root_qdisc(json: &str) -> Option<RootQdisc> {
    let qdiscs: Vec<serde_json::Value> = serde_json::from_str(json).ok()?;
    let root = qdiscs.iter().find(|q| q["root"] == true)?;
    Some(RootQdisc {
        kind: root["kind"].as_str()?.to_owned(),
        handle: root["handle"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Runs `tc ARGS` (in `netns` when given) and returns its standard output.
async fn run_tc(netns: Option<&Path>, args: &[String]) -> Result<String, BackendError> {
    let mut command = match netns {
        None => tokio::process::Command::new("tc"),
        Some(path) => {
            let mut command = tokio::process::Command::new("nsenter");
            command.arg(format!("--net={}", path.display())).arg("tc");
            command
        }
    };
    let output = command
        .args(args)
        .output()
        .await
        .map_err(|error| BackendError::Kernel(format!("run tc {}: {error}", args.join(" "))))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(BackendError::Kernel(format!(
            "tc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(class: ClassType, ceiling: u32, guaranteed: u32) -> SliceQosProfile {
        SliceQosProfile {
            class_type: class as i32,
            bw_ceiling: ceiling,
            bw_guaranteed: guaranteed,
            priority: 2,
            ..Default::default()
        }
    }

    fn joined(commands: &[Vec<String>]) -> Vec<String> {
        commands.iter().map(|c| c.join(" ")).collect()
    }

    #[test]
    fn tbf_is_kubeslices_command_with_replace() {
        let commands = tc_commands("tun0", &profile(ClassType::Tbf, 5000, 1000), None);
        assert_eq!(
            joined(&commands),
            ["qdisc replace dev tun0 root tbf rate 5000kbit burst 32kbit latency 500ms"]
        );
    }

    #[test]
    fn htb_guarantees_and_borrows_up_to_the_ceiling() {
        let commands = tc_commands("tun1", &profile(ClassType::Htb, 5000, 1000), None);
        assert_eq!(
            joined(&commands),
            [
                "qdisc replace dev tun1 root handle 1: htb default 1",
                "class replace dev tun1 parent 1: classid 1:1 htb rate 1000kbit ceil 5000kbit prio 2",
            ]
        );
        let no_guarantee = tc_commands("tun1", &profile(ClassType::Htb, 5000, 0), None);
        assert!(joined(&no_guarantee)[1].contains("rate 5000kbit ceil 5000kbit"));
    }

    #[test]
    fn an_htb_root_in_place_is_kept() {
        let htb = RootQdisc {
            kind: "htb".into(),
            handle: "1:".into(),
        };
        let commands = tc_commands("tun1", &profile(ClassType::Htb, 5000, 1000), Some(&htb));
        assert_eq!(joined(&commands).len(), 1);
        assert!(joined(&commands)[0].starts_with("class replace"));
        let tbf = RootQdisc {
            kind: "tbf".into(),
            handle: "8001:".into(),
        };
        let commands = tc_commands("tun1", &profile(ClassType::Htb, 5000, 1000), Some(&tbf));
        assert_eq!(commands.len(), 2);
    }

    #[test]
    fn root_qdisc_from_tc_json() {
        let json = r#"[{"kind":"htb","handle":"1:","root":true,"options":{}},{"kind":"fq","handle":"0:","parent":"1:1"}]"#;
        assert_eq!(
            parse_root_qdisc(json),
            Some(RootQdisc {
                kind: "htb".into(),
                handle: "1:".into()
            })
        );
        assert_eq!(parse_root_qdisc("[]"), None);
    }
}
