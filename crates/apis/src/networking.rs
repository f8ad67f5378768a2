//! `networking.kubeslice.io/v1beta1`: KubeSlice's SliceGateway, as the gw-recycler reads and edits it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::wire::wire_enum;

/// API group.
pub const GROUP: &str = "networking.kubeslice.io";
/// API version.
pub const VERSION: &str = "v1beta1";
/// Namespace of SliceGateways and gateway Deployments on a worker cluster.
pub const DEFAULT_NAMESPACE: &str = "kubeslice-system";
/// gRPC port of the router and gateway sidecars.
pub const SIDECAR_GRPC_PORT: u16 = 5000;

/// Deployment and pod label: slice name.
pub const LABEL_SLICE: &str = "kubeslice.io/slice";
/// Deployment and pod label: pod type ([`POD_TYPE_SLICEGATEWAY`] for gateways).
pub const LABEL_POD_TYPE: &str = "kubeslice.io/pod-type";
/// Value of [`LABEL_POD_TYPE`] on gateway Deployments and pods.
pub const POD_TYPE_SLICEGATEWAY: &str = "slicegateway";
/// Deployment label: the SliceGateway name.
pub const LABEL_SLICEGW: &str = "kubeslice.io/slicegw";
/// Pod label: the SliceGateway name.
pub const LABEL_SLICE_GW: &str = "kubeslice.io/slice-gw";
/// Pod label: the gateway Deployment name.
pub const LABEL_SLICE_GW_DEP: &str = "kubeslice.io/slice-gw-dep";
/// Pod label (`"true"`): keep this gateway out of the router's next hops.
pub const LABEL_EXCLUDE_GW_ROUTE: &str = "kubeslice.io/exclude-gw-route";
/// Deployment label (`"true"`): the gateway reconciler deletes this Deployment.
pub const LABEL_MARKED_FOR_DELETION: &str = "kubeslice.io/marked-for-deletion";
/// Node label; [`NODE_TYPE_GATEWAY`] marks nodes that host gateways.
pub const LABEL_NODE_TYPE: &str = "kubeslice.io/node-type";
/// Value of [`LABEL_NODE_TYPE`] for gateway nodes.
pub const NODE_TYPE_GATEWAY: &str = "gateway";
/// Pod label selecting the slice router: `networkservicemesh.io/impl=vl3-service-<slice>`.
pub const LABEL_NSM_IMPL: &str = "networkservicemesh.io/impl";
/// Prefix of [`LABEL_NSM_IMPL`]'s value; the slice name follows.
pub const NSM_IMPL_VL3_PREFIX: &str = "vl3-service-";

/// The [`LABEL_NSM_IMPL`] value of a slice's router.
pub fn slice_router_impl_label(slice: &str) -> String {
    format!("{NSM_IMPL_VL3_PREFIX}{slice}")
}

/// One side of a VPN gateway pair of a slice.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "networking.kubeslice.io",
    version = "v1beta1",
    kind = "SliceGateway",
    doc = "One side of a VPN gateway pair of a slice.",
    plural = "slicegateways",
    singular = "slicegateway",
    shortname = "gw",
    shortname = "slicegw",
    namespaced,
    status = "SliceGatewayStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Subnet","type":"string","jsonPath":".status.config.sliceGatewaySubnet"}"#,
    printcolumn = r#"{"name":"Remote Subnet","type":"string","jsonPath":".status.config.sliceGatewayRemoteSubnet"}"#,
    printcolumn = r#"{"name":"Remote Cluster","type":"string","jsonPath":".status.config.sliceGatewayRemoteClusterId"}"#,
    printcolumn = r#"{"name":"GW Status","type":"string","jsonPath":".status.config.sliceGatewayStatus"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SliceGatewaySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_name: Option<String>,
}

/// Observed state and backend configuration of a SliceGateway.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SliceGatewayStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<SliceGatewayConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_updated_on: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_names: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ips: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_context_updated_on: Option<i64>,
    /// One entry per gateway pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_pod_status: Option<Vec<GwPodInfo>>,
}

/// Gateway configuration received from the backend.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SliceGatewayConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_site_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_status: Option<String>,
    /// `"Server"` or `"Client"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_host_type: Option<HostType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_node_ports: Option<Vec<i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_remote_node_ips: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_remote_node_ports: Option<Vec<i32>>,
    /// The remote NSM subnet: destination of the router's route through the gateways.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_remote_subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_remote_vpn_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_local_vpn_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_remote_gateway_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_remote_cluster_id: Option<String>,
    /// Deployments being brought up by a recycle, before they become regular gateways.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_intermediate_deployments: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_connectivity_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gateway_protocol: Option<String>,
    #[serde(
        rename = "sliceGatewayServerLBIps",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub slice_gateway_server_lb_ips: Option<Vec<String>>,
}

/// Status of one gateway pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GwPodInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(
        rename = "podCreationTS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_creation_ts: Option<Time>,
    #[serde(
        rename = "originalPodCreationTS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub original_pod_creation_ts: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_pod_name: Option<String>,
    #[serde(rename = "podIP", default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// IP of the NSM interface towards the slice router (empty until the pod is wired).
    #[serde(
        rename = "localNsmIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub local_nsm_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_status: Option<TunnelStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_removed: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_port: Option<i32>,
}

impl GwPodInfo {
    /// The tunnel is UP. Go omits a zero `Status`, so a missing status means UP (0).
    pub fn tunnel_up(&self) -> bool {
        self.tunnel_status.as_ref().is_none_or(TunnelStatus::is_up)
    }

    /// The NSM IP, if set and non-empty.
    pub fn nsm_ip(&self) -> Option<&str> {
        self.local_nsm_ip.as_deref().filter(|ip| !ip.is_empty())
    }
}

/// Tunnel between a gateway pod and its peer. JSON names are PascalCase, as in the reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct TunnelStatus {
    #[serde(rename = "IntfName", default, skip_serializing_if = "Option::is_none")]
    pub intf_name: Option<String>,
    #[serde(rename = "LocalIP", default, skip_serializing_if = "Option::is_none")]
    pub local_ip: Option<String>,
    #[serde(rename = "RemoteIP", default, skip_serializing_if = "Option::is_none")]
    pub remote_ip: Option<String>,
    #[serde(rename = "Latency", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub latency: Option<i64>,
    #[serde(rename = "TxRate", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub tx_rate: Option<i64>,
    #[serde(rename = "RxRate", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub rx_rate: Option<i64>,
    #[serde(
        rename = "PacketLoss",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0))]
    pub packet_loss: Option<i64>,
    /// 0 = UP, 1 = DOWN (the sidecar proto enum); absent means 0.
    #[serde(rename = "Status", default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TunnelState>,
    #[serde(
        rename = "TunnelState",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub tunnel_state: Option<String>,
}

impl TunnelStatus {
    /// UP when `Status` is 0 or absent.
    pub fn is_up(&self) -> bool {
        self.status.unwrap_or(TunnelState::Up) == TunnelState::Up
    }
}

/// `tunnelStatus.Status`: an integer on the wire. Numbers other than 0 and 1 are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TunnelState {
    Up,
    Down,
    Other(i32),
}

impl TunnelState {
    /// The wire number.
    pub fn code(self) -> i32 {
        match self {
            TunnelState::Up => 0,
            TunnelState::Down => 1,
            TunnelState::Other(n) => n,
        }
    }
}

impl From<i32> for TunnelState {
    fn from(n: i32) -> Self {
        match n {
            0 => TunnelState::Up,
            1 => TunnelState::Down,
            n => TunnelState::Other(n),
        }
    }
}

impl Serialize for TunnelState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i32(self.code())
    }
}

impl<'de> Deserialize<'de> for TunnelState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        i32::deserialize(deserializer).map(TunnelState::from)
    }
}

impl JsonSchema for TunnelState {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TunnelState".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "integer", "format": "int32" })
    }
}

wire_enum! {
    /// `status.config.sliceGatewayHostType`.
    pub enum HostType {
        Server => "Server",
        Client => "Client",
    }
}

impl SliceGateway {
    /// The host type from `status.config`.
    pub fn host_type(&self) -> Option<&HostType> {
        self.config()?.slice_gateway_host_type.as_ref()
    }

    /// `status.config`, if present.
    pub fn config(&self) -> Option<&SliceGatewayConfig> {
        self.status.as_ref()?.config.as_ref()
    }

    /// `status.config.sliceGatewayIntermediateDeployments` (empty when unset).
    pub fn intermediate_deployments(&self) -> &[String] {
        self.config()
            .and_then(|c| c.slice_gateway_intermediate_deployments.as_deref())
            .unwrap_or_default()
    }

    /// `status.gatewayPodStatus` (empty when unset).
    pub fn gateway_pods(&self) -> &[GwPodInfo] {
        self.status
            .as_ref()
            .and_then(|s| s.gateway_pod_status.as_deref())
            .unwrap_or_default()
    }

    /// The `gatewayPodStatus` entry of pod `name` at `ip` (a pod replaced at another IP has
    /// none).
    pub fn published_pod(&self, name: &str, ip: &str) -> Option<&GwPodInfo> {
        self.gateway_pods()
            .iter()
            .find(|p| p.pod_name.as_deref() == Some(name) && p.pod_ip.as_deref() == Some(ip))
    }

    /// The `peerPodName` published for gateway pod `pod` (`None`: not named yet, or empty).
    pub fn peer_of(&self, pod: &str) -> Option<&str> {
        self.gateway_pods()
            .iter()
            .find(|p| p.pod_name.as_deref() == Some(pod))
            .and_then(|p| p.peer_pod_name.as_deref())
            .filter(|peer| !peer.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn slice_gateway_round_trips() {
        let input = json!({
            "apiVersion": "networking.kubeslice.io/v1beta1", "kind": "SliceGateway",
            "metadata": {"name": "red-cluster-a-cluster-b", "namespace": "kubeslice-system"},
            "spec": {"sliceName": "red", "siteName": "a"},
            "status": {
                "config": {
                    "sliceGatewayId": "gw-1", "sliceGatewayName": "red-cluster-a-cluster-b", "sliceName": "red",
                    "sliceSiteName": "a", "sliceGatewayType": "OpenVPN", "sliceGatewaySubnet": "10.1.1.0/24",
                    "sliceGatewayStatus": "Ready", "sliceGatewayHostType": "Server",
                    "sliceGatewayNodePorts": [30001, 30002], "sliceGatewayRemoteNodeIps": ["1.2.3.4"],
                    "sliceGatewayRemoteNodePorts": [30003], "sliceGatewayRemoteSubnet": "10.1.2.0/24",
                    "sliceGatewayRemoteVpnIp": "10.0.0.2", "sliceGatewayLocalVpnIp": "10.0.0.1",
                    "sliceGatewayRemoteGatewayId": "gw-2", "sliceGatewayRemoteClusterId": "cluster-b",
                    "sliceGatewayIntermediateDeployments": ["red-cluster-a-cluster-b-0-1"],
                    "sliceGatewayConnectivityType": "NodePort", "sliceGatewayProtocol": "UDP",
                    "sliceGatewayServerLBIps": ["5.6.7.8"]
                },
                "configUpdatedOn": 1700000000, "podName": "p", "podNames": ["p"], "podStatus": "Running",
                "podIps": ["10.244.0.5"], "peerIp": "10.0.0.2", "connectionContextUpdatedOn": 1700000001,
                "gatewayPodStatus": [
                    {"podName": "gw-0", "podCreationTS": "2026-11-29T10:00:00Z", "originalPodCreationTS": "2026-11-29T09:00:00Z",
                     "peerPodName": "peer-0", "podIP": "10.244.0.5", "localNsmIP": "192.168.0.1",
                     "tunnelStatus": {"IntfName": "tun0", "LocalIP": "10.0.0.1", "RemoteIP": "10.0.0.2",
                                      "Latency": 3, "TxRate": 10, "RxRate": 11, "PacketLoss": 0, "Status": 1,
                                      "TunnelState": "DOWN"},
                     "routeRemoved": 0, "remotePort": 30003},
                    {"podName": "gw-1", "podIP": "10.244.0.6", "localNsmIP": "", "tunnelStatus": {"IntfName": "tun0"}}
                ]
            }
        });
        let gw: SliceGateway = serde_json::from_value(input.clone()).expect("decodes");
        assert_eq!(serde_json::to_value(&gw).expect("serialises"), input);
        assert_eq!(gw.host_type(), Some(&HostType::Server));
        assert_eq!(
            gw.intermediate_deployments(),
            ["red-cluster-a-cluster-b-0-1"]
        );
        let pods = gw.gateway_pods();
        assert!(!pods[0].tunnel_up(), "Status 1 is DOWN");
        assert!(pods[1].tunnel_up(), "absent Status is 0, UP");
        assert_eq!(pods[0].nsm_ip(), Some("192.168.0.1"));
        assert_eq!(pods[1].nsm_ip(), None);
        assert_eq!(gw.peer_of("gw-0"), Some("peer-0"));
        assert_eq!(gw.peer_of("gw-1"), None, "no peerPodName");
        assert_eq!(gw.peer_of("gw-9"), None, "no such pod");
    }

    #[test]
    fn tunnel_state_numbers() {
        assert_eq!(TunnelState::from(0), TunnelState::Up);
        assert_eq!(TunnelState::from(1), TunnelState::Down);
        assert_eq!(TunnelState::from(7).code(), 7);
        let s: TunnelStatus = serde_json::from_value(json!({"Status": 0})).expect("decodes");
        assert!(s.is_up());
        assert_eq!(
            serde_json::to_value(&s).expect("serialises"),
            json!({"Status": 0})
        );
    }

    #[test]
    fn host_types_are_exact() {
        assert_eq!(HostType::from("Server"), HostType::Server);
        assert_eq!(HostType::from("Client"), HostType::Client);
        assert_eq!(HostType::from("server"), HostType::Other("server".into()));
        let empty = SliceGateway::new("x", SliceGatewaySpec::default());
        assert_eq!(empty.host_type(), None);
        assert!(empty.intermediate_deployments().is_empty());
        assert_eq!(slice_router_impl_label("red"), "vl3-service-red");
    }
}
