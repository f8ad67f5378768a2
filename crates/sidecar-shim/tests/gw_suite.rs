//! One behaviour suite for `sidecar.GwSidecarService`, run against both backends
//! through a real tonic client over TCP. The kernel variant builds nsm0, tun0 and
//! a VPN link in a fresh network namespace and checks routes with `ip -j route`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use capstan_proto::sidecar::{
    ClassType, GwPodStatus, RemoteGwVpnIp, SliceGwConnectionContext, SliceQosProfile,
    TunnelInterfaceStatus, TunnelStatusType,
};
use common::{Netns, ServerGuard};
use sidecar_shim::gw::kernel::KernelGw;
use sidecar_shim::gw::memory::{MemoryGw, MemoryGwStatus, MemoryTunnel};
use sidecar_shim::gw::{GwBackend, GwSidecar, PeerConfig, PodIdentity};
use tonic::Code;
use tonic::transport::Channel;

const SUBNET: &str = "10.2.0.0/16";

enum View {
    Memory(Arc<MemoryGw>),
    Kernel(Netns),
}

struct Harness {
    client: GwSidecarServiceClient<Channel>,
    backend: Arc<dyn GwBackend>,
    view: View,
    _server: ServerGuard,
}

fn identity(pod_name: &str) -> PodIdentity {
    PodIdentity {
        node_ip: "192.0.2.10".into(),
        pod_ip: "10.244.1.7".into(),
        pod_name: pod_name.into(),
    }
}

impl Harness {
    /// nsm0 at 10.1.1.1, tun0 10.8.0.1 -> 10.8.0.2.
    fn add_gateway_interfaces(&self) {
        match &self.view {
            View::Memory(memory) => memory.set_status(MemoryGwStatus {
                nsm_ip: "10.1.1.1".into(),
                tunnel: Some(MemoryTunnel {
                    net_interface: "tun0".into(),
                    local_ip: "10.8.0.1".into(),
                    peer_ip: "10.8.0.2".into(),
                    ..MemoryTunnel::default()
                }),
                ..MemoryGwStatus::default()
            }),
            View::Kernel(netns) => {
                netns.veth("nsm0", "nsm0-peer", Some("10.1.1.1/24"));
                netns.ip(&["tuntap", "add", "dev", "tun0", "mode", "tun"]);
                netns.ip(&["addr", "add", "10.8.0.1", "peer", "10.8.0.2", "dev", "tun0"]);
            }
        }
    }

    /// Remote subnet -> gateway.
    fn routes(&self) -> BTreeMap<String, String> {
        match &self.view {
            View::Memory(memory) => memory.snapshot().routes,
            View::Kernel(netns) => netns
                .gateway_routes()
                .into_iter()
                .map(|(dst, gateways)| (dst, gateways.into_iter().collect::<Vec<_>>().join(",")))
                .collect(),
        }
    }

    async fn status(&mut self) -> GwPodStatus {
        self.client
            .get_status(())
            .await
            .expect("GetStatus")
            .into_inner()
    }

    async fn connect(&mut self, vpn_ip: &str, subnet: &str) -> Result<String, tonic::Status> {
        let request = SliceGwConnectionContext {
            slice_id: "red".into(),
            remote_slice_gw_vpn_ip: vpn_ip.into(),
            remote_slice_gw_nsm_subnet: subnet.into(),
            remote_slice_gw_node_port: "30001".into(),
            ..Default::default()
        };
        Ok(self
            .client
            .update_connection_context(request)
            .await?
            .into_inner()
            .status_msg)
    }
}

async fn harness(backend: Arc<dyn GwBackend>, view: View, peer: PeerConfig) -> Harness {
    let server =
        common::serve(GwSidecar::new(backend.clone(), identity("gw-a-0"), peer).into_server())
            .await;
    let client = GwSidecarServiceClient::new(common::channel(server.addr).await);
    Harness {
        client,
        backend,
        view,
        _server: server,
    }
}

async fn memory_harness() -> Harness {
    let memory = Arc::new(MemoryGw::new(MemoryGwStatus::default()));
    harness(memory.clone(), View::Memory(memory), PeerConfig::default()).await
}

async fn kernel_harness() -> Option<Harness> {
    let netns = common::netns()?;
    // The remote VPN IPs (10.9.0.x) are reachable through vpn0.
    netns.veth("vpn0", "vpn0-peer", Some("10.9.0.1/24"));
    let backend = KernelGw::connect(Some(&netns.path()), Duration::from_millis(50))
        .expect("netlink in test namespace");
    Some(
        harness(
            Arc::new(backend),
            View::Kernel(netns),
            PeerConfig::default(),
        )
        .await,
    )
}

async fn status_without_interfaces(h: &mut Harness) {
    let status = h.status().await;
    assert_eq!(status.node_ip, "192.0.2.10");
    assert_eq!(status.gateway_pod_ip, "10.244.1.7");
    assert_eq!(status.gateway_pod_name, "gw-a-0");
    let nsm = status.nsm_intf_status.expect("nsm status is always set");
    assert_eq!(
        (nsm.nsm_interface_name.as_str(), nsm.nsm_ip.as_str()),
        ("nsm0", "")
    );
    let tunnel = status.tunnel_status.expect("tunnel status is always set");
    assert_eq!(
        tunnel.status,
        TunnelStatusType::GwTunnelStateDown as i32,
        "no tunnel is DOWN"
    );
    assert_eq!(tunnel.net_interface, "");
}

async fn status_with_interfaces(h: &mut Harness) {
    h.add_gateway_interfaces();
    let status = h.status().await;
    let nsm = status.nsm_intf_status.expect("nsm status");
    assert_eq!(
        (nsm.nsm_interface_name.as_str(), nsm.nsm_ip.as_str()),
        ("nsm0", "10.1.1.1")
    );
    let tunnel = status.tunnel_status.expect("tunnel status");
    assert_eq!(tunnel.net_interface, "tun0");
    assert_eq!(tunnel.local_ip, "10.8.0.1");
    assert_eq!(tunnel.peer_ip, "10.8.0.2");
    assert_eq!(tunnel.packet_loss, 0);
    assert_eq!(tunnel.status, TunnelStatusType::GwTunnelStateUp as i32);
}

async fn connection_context_routes_the_remote_subnet(h: &mut Harness) {
    assert_eq!(
        h.connect("10.9.0.2", SUBNET).await.expect("connect"),
        "Connection Context Updated Successfully"
    );
    assert_eq!(h.routes().get(SUBNET).map(String::as_str), Some("10.9.0.2"));
    h.connect("10.9.0.2", SUBNET)
        .await
        .expect("same context again");
    h.connect("10.9.0.3", "10.2.5.5/16")
        .await
        .expect("new remote gateway");
    assert_eq!(h.routes().get(SUBNET).map(String::as_str), Some("10.9.0.3"));

    let before = h.routes();
    let cases = [
        ("", SUBNET, "Invalid Remote Slice Gateway VPN IP"),
        ("10.9.0", SUBNET, "Invalid Remote Slice Gateway VPN IP"),
        ("10.9.0.4", "", "Invalid Remote Slice Gateway Subnet"),
        ("10.9.0.4", "10.2.0.0", "Error in Parsing CIDR"),
        ("10.9.0.4", "10.2.0.0/99", "Error in Parsing CIDR"),
        (
            "10.9.0.4",
            "fd00::/64",
            "Invalid Remote Slice Gateway VPN IP",
        ),
    ];
    for (vpn, subnet, message) in cases {
        let status = h.connect(vpn, subnet).await.expect_err("invalid context");
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, message),
            "{vpn:?} {subnet:?}"
        );
    }
    assert_eq!(
        h.routes(),
        before,
        "invalid requests must not change routes"
    );
}

fn qos_profile() -> SliceQosProfile {
    SliceQosProfile {
        slice_name: "red".into(),
        slice_id: "red-id".into(),
        qos_profile_name: "gold".into(),
        class_type: ClassType::Htb as i32,
        bw_ceiling: 5000,
        bw_guaranteed: 1000,
        priority: 2,
        dscp_class: "AF11".into(),
        ..Default::default()
    }
}

async fn qos_profile_is_validated_and_applied(h: &mut Harness) {
    h.add_gateway_interfaces();
    let mut invalid = qos_profile();
    invalid.bw_guaranteed = 6000;
    let status = h
        .client
        .update_slice_qos_profile(invalid)
        .await
        .expect_err("invalid");
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "Invalid bandwidth: the ceiling must be set and not below the guaranteed bandwidth"
        )
    );
    if let View::Kernel(netns) = &h.view {
        let qdisc = netns.tc_root_qdisc("tun0");
        assert_ne!(
            qdisc["kind"], "htb",
            "nothing applied for an invalid profile: {qdisc}"
        );
    }

    let mut tbf = qos_profile();
    tbf.class_type = ClassType::Tbf as i32;
    tbf.dscp_class = "QOS_PROFILE_DSCP_CLASS_AF11".into();
    let reply = h
        .client
        .update_slice_qos_profile(tbf)
        .await
        .expect("TBF profile");
    assert_eq!(
        reply.into_inner().status_msg,
        "Slice QoS policy enforced successfully"
    );
    match &h.view {
        View::Memory(memory) => assert_eq!(memory.snapshot().qos["red"].class_type, "TBF"),
        View::Kernel(netns) => {
            let qdisc = netns.tc_root_qdisc("tun0");
            assert_eq!(qdisc["kind"], "tbf", "{qdisc}");
            // 5000 kbit/s = 625000 bytes/s.
            assert_eq!(qdisc["options"]["rate"], 625_000, "{qdisc}");
        }
    }

    let reply = h
        .client
        .update_slice_qos_profile(qos_profile())
        .await
        .expect("HTB profile");
    assert_eq!(
        reply.into_inner().status_msg,
        "Slice QoS policy enforced successfully"
    );
    h.client
        .update_slice_qos_profile(qos_profile())
        .await
        .expect("same profile again");
    match &h.view {
        View::Memory(memory) => {
            let recorded = memory.snapshot().qos;
            assert_eq!(recorded["red"].class_type, "HTB");
            assert_eq!(recorded["red"].bw_ceiling, 5000);
        }
        View::Kernel(netns) => {
            assert_eq!(netns.tc_root_qdisc("tun0")["kind"], "htb");
            let classes = netns.tc(&["class", "show", "dev", "tun0"]);
            assert!(classes.contains("rate 1Mbit ceil 5Mbit"), "{classes}");
        }
    }
}

async fn remote_pod_name_asks_the_peer(h: &mut Harness) {
    // The peer gateway's sidecar (memory backend) on its own port.
    let peer_backend = Arc::new(MemoryGw::new(MemoryGwStatus {
        nsm_ip: "10.5.1.1".into(),
        tunnel: None,
        ..MemoryGwStatus::default()
    }));
    let peer = common::serve(
        GwSidecar::new(peer_backend, identity("gw-b-0"), PeerConfig::default()).into_server(),
    )
    .await;
    let to_peer = PeerConfig {
        port: peer.addr.port(),
        timeout: Duration::from_secs(2),
        tls: None,
    };
    let local =
        common::serve(GwSidecar::new(h.backend.clone(), identity("gw-a-0"), to_peer).into_server())
            .await;
    let mut client = GwSidecarServiceClient::new(common::channel(local.addr).await);

    let remote = client
        .get_slice_gw_remote_pod_name(RemoteGwVpnIp {
            remote_gw_vpn_ip: "127.0.0.1".into(),
        })
        .await
        .expect("peer answers")
        .into_inner();
    let mut direct = GwSidecarServiceClient::new(common::channel(peer.addr).await);
    assert_eq!(
        remote,
        direct
            .get_status(())
            .await
            .expect("peer status")
            .into_inner()
    );
    assert_eq!(remote.gateway_pod_name, "gw-b-0");

    for bad in ["", "peer", "10.9.0"] {
        let status = client
            .get_slice_gw_remote_pod_name(RemoteGwVpnIp {
                remote_gw_vpn_ip: bad.into(),
            })
            .await
            .expect_err("invalid VPN IP");
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, "Invalid Remote Slice Gateway VPN IP")
        );
    }

    // A peer that is gone: Unavailable, with the address in the reason.
    let port = peer.addr.port();
    drop(peer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = client
        .get_slice_gw_remote_pod_name(RemoteGwVpnIp {
            remote_gw_vpn_ip: "127.0.0.1".into(),
        })
        .await
        .expect_err("peer is down");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains(&format!("127.0.0.1:{port}")),
        "{}",
        status.message()
    );
}

common::both_backends!(
    status_without_interfaces,
    status_with_interfaces,
    connection_context_routes_the_remote_subnet,
    qos_profile_is_validated_and_applied,
    remote_pod_name_asks_the_peer,
);

/// Every field of the memory backend's tunnel reaches `GetStatus` as itself (distinct values, so
/// a swapped or dropped field fails), read anew on each call: `down` is DOWN (wire value 1) and
/// clearing it is UP (0) again.
#[tokio::test]
async fn memory_status_maps_field_by_field_to_get_status() {
    let mut h = memory_harness().await;
    let View::Memory(memory) = &h.view else {
        unreachable!("memory harness")
    };
    let memory = memory.clone();
    let tunnel = |down| MemoryTunnel {
        net_interface: "tun3".into(),
        local_ip: "10.8.0.5".into(),
        peer_ip: "10.8.0.6".into(),
        latency: 11,
        tx_rate: 22,
        rx_rate: 33,
        packet_loss: 44,
        down,
    };
    memory.set_status(MemoryGwStatus {
        nsm_ip: "10.1.1.7".into(),
        tunnel: Some(tunnel(true)),
        ..MemoryGwStatus::default()
    });
    let status = h.status().await;
    assert_eq!(status.nsm_intf_status.expect("nsm").nsm_ip, "10.1.1.7");
    let reported = status.tunnel_status.expect("tunnel");
    let expected = TunnelInterfaceStatus {
        net_interface: "tun3".into(),
        local_ip: "10.8.0.5".into(),
        peer_ip: "10.8.0.6".into(),
        latency: 11,
        tx_rate: 22,
        rx_rate: 33,
        packet_loss: 44,
        status: 1,
    };
    assert_eq!(reported, expected);

    memory.set_status(MemoryGwStatus {
        nsm_ip: "10.1.1.7".into(),
        tunnel: Some(tunnel(false)),
        ..MemoryGwStatus::default()
    });
    let reported = h.status().await.tunnel_status.expect("tunnel");
    assert_eq!(reported.status, 0, "UP once `down` is cleared");
}

/// Kernel only: a tunnel whose packets never come back is DOWN after 20 checks at
/// 100% loss, and UP again once replies arrive.
#[tokio::test]
async fn kernel_tunnel_goes_down_after_full_loss_and_recovers() {
    let Some(netns) = common::netns() else {
        return;
    };
    let Some(far) = common::netns() else {
        return;
    };
    // tun9 here, its far end in another namespace that first drops everything.
    netns.ip(&[
        "link",
        "add",
        "tun9",
        "type",
        "veth",
        "peer",
        "name",
        "sink9",
        "netns",
        far.name(),
    ]);
    netns.ip(&["addr", "add", "10.7.0.1/24", "dev", "tun9"]);
    netns.ip(&["link", "set", "tun9", "up"]);
    far.ip(&["link", "set", "sink9", "up"]);
    let link: serde_json::Value =
        serde_json::from_str(&far.ip(&["-j", "link", "show", "sink9"])).expect("json");
    let mac = link[0]["address"].as_str().expect("sink9 MAC").to_owned();
    netns.ip(&[
        "neigh",
        "replace",
        "10.7.0.2",
        "lladdr",
        &mac,
        "dev",
        "tun9",
        "nud",
        "permanent",
    ]);
    far.exec(&["sysctl", "-q", "-w", "net.ipv4.icmp_ratelimit=0"]);

    let backend = Arc::new(
        KernelGw::connect(Some(&netns.path()), Duration::from_millis(20)).expect("netlink"),
    );
    let server = common::serve(
        GwSidecar::new(backend, identity("gw-a-0"), PeerConfig::default()).into_server(),
    )
    .await;
    let mut client = GwSidecarServiceClient::new(common::channel(server.addr).await);

    // UDP from inside the namespace towards the far end, every 2 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        // A socket belongs to the namespace it was created in.
        let socket = sidecar_shim::netns::in_namespace(Some(&netns.path()), || {
            Ok(std::net::UdpSocket::bind("0.0.0.0:0")?)
        })
        .expect("udp socket in the namespace");
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = socket.send_to(b"probe", "10.7.0.2:9");
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let wait_for = |wanted: TunnelStatusType| {
        let mut client = client.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let status = client.get_status(()).await.expect("GetStatus").into_inner();
                let tunnel = status.tunnel_status.expect("tunnel");
                if tunnel.status == wanted as i32 {
                    return tunnel;
                }
                assert!(
                    Instant::now() < deadline,
                    "tunnel never became {wanted:?}: {tunnel:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    let down = wait_for(TunnelStatusType::GwTunnelStateDown).await;
    assert_eq!(down.net_interface, "tun9");
    assert_eq!(down.packet_loss, 100);
    assert!(down.tx_rate > 0, "{down:?}");

    // The far end gets the address and answers with ICMP port unreachable.
    far.ip(&["addr", "add", "10.7.0.2/24", "dev", "sink9"]);
    let up = wait_for(TunnelStatusType::GwTunnelStateUp).await;
    assert!(up.packet_loss < 100, "{up:?}");

    stop.store(true, Ordering::Relaxed);
    sender.join().expect("sender thread");
    let _ = client.get_status(()).await.expect("still serving");
}

/// Kernel only: QoS needs a tunnel interface; without one the call fails with the reason.
#[tokio::test]
async fn kernel_qos_without_tunnel_is_internal() {
    let Some(mut h) = kernel_harness().await else {
        return;
    };
    let status = h
        .client
        .update_slice_qos_profile(qos_profile())
        .await
        .expect_err("no tunnel");
    assert_eq!(status.code(), Code::Internal);
    assert!(status.message().contains("tun"), "{}", status.message());
}

/// Kernel only: `GetStatus` answers from a cache of links and addresses, so a change made outside
/// the sidecar after a first read (an address moved, the tunnel deleted) must reach the next read.
#[tokio::test]
async fn kernel_status_follows_changes_made_outside_the_sidecar() {
    let Some(mut h) = kernel_harness().await else {
        return;
    };
    h.add_gateway_interfaces();
    let nsm_ip = |status: &GwPodStatus| status.nsm_intf_status.clone().expect("nsm").nsm_ip;
    let first = h.status().await;
    assert_eq!(nsm_ip(&first), "10.1.1.1");
    assert_eq!(first.tunnel_status.expect("tunnel").local_ip, "10.8.0.1");

    let View::Kernel(netns) = &h.view else {
        unreachable!("kernel harness")
    };
    netns.ip(&["addr", "del", "10.1.1.1/24", "dev", "nsm0"]);
    netns.ip(&["addr", "add", "10.1.1.5/24", "dev", "nsm0"]);
    netns.ip(&["addr", "del", "10.8.0.1", "peer", "10.8.0.2", "dev", "tun0"]);
    netns.ip(&[
        "addr",
        "add",
        "10.8.0.9",
        "peer",
        "10.8.0.10",
        "dev",
        "tun0",
    ]);
    let moved = h.status().await;
    assert_eq!(nsm_ip(&moved), "10.1.1.5", "the moved nsm0 address");
    let tunnel = moved.tunnel_status.expect("tunnel");
    assert_eq!(
        (tunnel.local_ip.as_str(), tunnel.peer_ip.as_str()),
        ("10.8.0.9", "10.8.0.10"),
        "the moved tunnel address"
    );

    let View::Kernel(netns) = &h.view else {
        unreachable!("kernel harness")
    };
    netns.ip(&["link", "del", "tun0"]);
    let gone = h.status().await.tunnel_status.expect("tunnel");
    assert_eq!(gone.net_interface, "", "the deleted tunnel");
    assert_eq!(gone.status, TunnelStatusType::GwTunnelStateDown as i32);
}
