//! Gateway state kept in this process: set by flags, changed at run time through
//! the admin server (`GET`/`PUT /memory/gw/status`, `GET /memory/gw`), for tests
//! and the demo.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use capstan_proto::sidecar::{ClassType, SliceQosProfile, TunnelInterfaceStatus, TunnelStatusType};
use serde::{Deserialize, Serialize};

use super::{GatewayRoute, GwBackend};
use crate::backend::BackendError;
use crate::net::Cidr;

/// Path of the memory backend's admin routes.
pub const ADMIN_PATH: &str = "/memory/gw";

/// What `GetStatus` reports from the memory backend.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryGwStatus {
    pub nsm_ip: String,
    /// `None`: no tunnel interface (reported DOWN).
    pub tunnel: Option<MemoryTunnel>,
    /// `GetStatus` fails with UNAVAILABLE, as a sidecar that is restarting or overloaded does
    /// (for tests of what its callers do then).
    pub unavailable: bool,
    /// Where `GetSliceGwRemotePodName` reaches the peer gateway's sidecar ("": at the VPN IP it
    /// is asked for). Memory gateways share no tunnel: a test or the demo playing the VPN says
    /// which peer this pod's tunnel reaches.
    pub peer_address: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryTunnel {
    pub net_interface: String,
    #[serde(rename = "localIP")]
    pub local_ip: String,
    #[serde(rename = "peerIP")]
    pub peer_ip: String,
    pub latency: u64,
    pub tx_rate: u64,
    pub rx_rate: u64,
    pub packet_loss: u64,
    pub down: bool,
}

/// A QoS profile as recorded (the memory backend's "applied" state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QosRecord {
    pub slice_name: String,
    pub class_type: String,
    pub bw_ceiling: u32,
    pub bw_guaranteed: u32,
    pub priority: u32,
    pub dscp_class: String,
}

/// Everything the memory backend holds, as `GET /memory/gw` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryGwSnapshot {
    pub status: MemoryGwStatus,
    /// Remote subnet -> remote VPN IP.
    pub routes: BTreeMap<String, String>,
    /// Last profile per slice.
    pub qos: BTreeMap<String, QosRecord>,
}

#[derive(Debug, Default)]
struct Inner {
    status: MemoryGwStatus,
    routes: BTreeMap<Cidr, IpAddr>,
    qos: BTreeMap<String, QosRecord>,
}

/// The memory backend.
#[derive(Debug, Default)]
pub struct MemoryGw {
    inner: Mutex<Inner>,
}

impl MemoryGw {
    pub fn new(status: MemoryGwStatus) -> Self {
        Self {
            inner: Mutex::new(Inner {
                status,
                ..Inner::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        capstan_runtime::sync::lock(&self.inner)
    }

    pub fn set_status(&self, status: MemoryGwStatus) {
        self.lock().status = status;
    }

    pub fn snapshot(&self) -> MemoryGwSnapshot {
        let inner = self.lock();
        MemoryGwSnapshot {
            status: inner.status.clone(),
            routes: inner
                .routes
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            qos: inner.qos.clone(),
        }
    }

    /// Admin routes to read the state and change the status at run time.
    pub fn admin_router(self: Arc<Self>) -> axum::Router {
        async fn snapshot(State(gw): State<Arc<MemoryGw>>) -> Json<MemoryGwSnapshot> {
            Json(gw.snapshot())
        }
        async fn status(State(gw): State<Arc<MemoryGw>>) -> Json<MemoryGwStatus> {
            Json(gw.snapshot().status)
        }
        async fn put_status(
            State(gw): State<Arc<MemoryGw>>,
            Json(status): Json<MemoryGwStatus>,
        ) -> Json<MemoryGwStatus> {
            tracing::info!(?status, "memory gateway status replaced");
            gw.set_status(status.clone());
            Json(status)
        }
        axum::Router::new()
            .route(ADMIN_PATH, get(snapshot))
            .route(&format!("{ADMIN_PATH}/status"), get(status).put(put_status))
            .with_state(self)
    }
}

#[tonic::async_trait]
impl GwBackend for MemoryGw {
    async fn nsm_ip(&self) -> Result<String, BackendError> {
        let inner = self.lock();
        if inner.status.unavailable {
            return Err(BackendError::Unavailable(
                "the memory gateway was told to be unavailable (PUT /memory/gw/status)".into(),
            ));
        }
        Ok(inner.status.nsm_ip.clone())
    }

    async fn tunnel_status(&self) -> Result<TunnelInterfaceStatus, BackendError> {
        let status = self.lock().status.tunnel.clone();
        Ok(match status {
            None => TunnelInterfaceStatus {
                status: TunnelStatusType::GwTunnelStateDown as i32,
                ..Default::default()
            },
            Some(tunnel) => TunnelInterfaceStatus {
                net_interface: tunnel.net_interface,
                local_ip: tunnel.local_ip,
                peer_ip: tunnel.peer_ip,
                latency: tunnel.latency,
                tx_rate: tunnel.tx_rate,
                rx_rate: tunnel.rx_rate,
                packet_loss: tunnel.packet_loss,
                status: if tunnel.down {
                    TunnelStatusType::GwTunnelStateDown
                } else {
                    TunnelStatusType::GwTunnelStateUp
                } as i32,
            },
        })
    }

    /// [`MemoryGwStatus::peer_address`] when set, else the VPN IP itself.
    async fn peer_address(&self, remote_vpn_ip: IpAddr) -> IpAddr {
        self.lock()
            .status
            .peer_address
            .parse()
            .unwrap_or(remote_vpn_ip)
    }

    async fn route_via(&self, route: GatewayRoute) -> Result<(), BackendError> {
        self.lock().routes.insert(route.subnet, route.via);
        Ok(())
    }

    async fn apply_qos(&self, profile: &SliceQosProfile) -> Result<(), BackendError> {
        let class_type = ClassType::try_from(profile.class_type)
            .map(|c| c.as_str_name().to_owned())
            .unwrap_or_default();
        let record = QosRecord {
            slice_name: profile.slice_name.clone(),
            class_type,
            bw_ceiling: profile.bw_ceiling,
            bw_guaranteed: profile.bw_guaranteed,
            priority: profile.priority,
            dscp_class: profile.dscp_class.clone(),
        };
        self.lock().qos.insert(profile.slice_name.clone(), record);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_json_uses_proto_style_names() {
        let status: MemoryGwStatus = serde_json::from_str(
            r#"{"nsmIp":"10.1.1.1","tunnel":{"netInterface":"tun0","localIP":"10.9.0.1","packetLoss":100,"down":true}}"#,
        )
        .expect("parses");
        let tunnel = status.tunnel.expect("tunnel");
        assert_eq!(status.nsm_ip, "10.1.1.1");
        assert_eq!(tunnel.local_ip, "10.9.0.1");
        assert_eq!(tunnel.packet_loss, 100);
        assert!(tunnel.down);
    }

    #[tokio::test]
    async fn missing_tunnel_is_down() {
        let gw = MemoryGw::new(MemoryGwStatus::default());
        let tunnel = gw.tunnel_status().await.expect("status");
        assert_eq!(tunnel.status, TunnelStatusType::GwTunnelStateDown as i32);
        assert_eq!(tunnel.net_interface, "");
    }

    #[tokio::test]
    async fn the_peer_answers_where_the_tunnel_reaches() {
        let vpn_ip: IpAddr = "10.9.0.2".parse().expect("ip");
        let gw = MemoryGw::new(MemoryGwStatus::default());
        // No peer address: the VPN IP itself.
        assert_eq!(gw.peer_address(vpn_ip).await, vpn_ip);
        // A tunnel's peer IP is only reported (KubeSlice's is the VPN address).
        gw.set_status(MemoryGwStatus {
            tunnel: Some(MemoryTunnel {
                peer_ip: "10.8.0.2".into(),
                ..MemoryTunnel::default()
            }),
            ..MemoryGwStatus::default()
        });
        assert_eq!(gw.peer_address(vpn_ip).await, vpn_ip);
        gw.set_status(MemoryGwStatus {
            peer_address: "127.7.0.5".into(),
            ..MemoryGwStatus::default()
        });
        assert_eq!(
            gw.peer_address(vpn_ip).await,
            "127.7.0.5".parse::<IpAddr>().expect("ip")
        );
    }
}
