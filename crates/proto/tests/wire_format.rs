//! Pins the protobuf encoding of the sidecar contracts against bytes written by
//! hand from the field numbers in the KubeSlice .proto files: if a field is
//! renumbered or retyped, these fail.

use capstan_proto::{machine_driver, router, sidecar};
use prost::Message;

/// Length-delimited field: key (tag << 3 | 2), length, bytes.
fn string_field(tag: u8, value: &str) -> Vec<u8> {
    let mut out = vec![
        (tag << 3) | 2,
        u8::try_from(value.len()).expect("short test value"),
    ];
    out.extend_from_slice(value.as_bytes());
    out
}

/// Varint field with a one-byte value: key (tag << 3 | 0), value.
fn varint_field(tag: u8, value: u8) -> Vec<u8> {
    assert!(value < 0x80 && tag < 16);
    vec![tag << 3, value]
}

fn nested(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![
        (tag << 3) | 2,
        u8::try_from(body.len()).expect("short body"),
    ];
    out.extend_from_slice(body);
    out
}

fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, expected: &[u8]) {
    assert_eq!(msg.encode_to_vec(), expected, "encoding of {msg:?}");
    assert_eq!(&M::decode(expected).expect("decodes"), msg, "decoding");
}

#[test]
fn ecmp_update_info_uses_tag_8_for_nsm_ip_to_remove() {
    let msg = router::EcmpUpdateInfo {
        remote_slice_gw_nsm_subnet: "10.1.0.0/16".into(),
        nsm_ip_to_remove: "10.1.1.1".into(),
    };
    let expected = [
        0x0a, 0x0b, b'1', b'0', b'.', b'1', b'.', b'0', b'.', b'0', b'/', b'1',
        b'6', // field 1
        0x42, 0x08, b'1', b'0', b'.', b'1', b'.', b'1', b'.', b'1', // field 8, not 2
    ];
    assert_wire(&msg, &expected);
}

#[test]
fn slice_gw_con_context_enum_and_repeated_string() {
    let msg = router::SliceGwConContext {
        slice_id: "red".into(),
        local_slice_gw_host_type: router::SliceGwHostType::SliceGwClient as i32,
        remote_slice_gw_nsm_subnet: "10.2.0.0/16".into(),
        local_nsm_gw_peer_ip: "10.1.1.2".into(),
        local_nsm_gw_peer_ip_list: vec!["10.1.1.2".into(), "10.1.1.3".into()],
        ..Default::default()
    };
    let expected = [
        string_field(1, "red"),
        varint_field(4, 1), // SLICE_GW_CLIENT = 1
        string_field(6, "10.2.0.0/16"),
        string_field(7, "10.1.1.2"),
        string_field(8, "10.1.1.2"), // repeated: one key per element
        string_field(8, "10.1.1.3"),
    ]
    .concat();
    assert_wire(&msg, &expected);
}

#[test]
fn server_host_type_is_zero_and_not_encoded() {
    let msg = router::SliceGwConContext {
        local_slice_gw_host_type: router::SliceGwHostType::SliceGwServer as i32,
        ..Default::default()
    };
    assert!(msg.encode_to_vec().is_empty());
}

#[test]
fn verify_route_and_connection_info() {
    let req = router::VerifyRouteAddRequest {
        nsm_ip: "10.1.1.1".into(),
        dst_ip: "10.2.0.0/16".into(),
    };
    assert_wire(
        &req,
        &[string_field(1, "10.1.1.1"), string_field(2, "10.2.0.0/16")].concat(),
    );
    assert_wire(
        &router::VerifyRouteAddResponse {
            is_route_present: true,
        },
        &[0x08, 0x01],
    );

    let info = router::ClientConnectionInfo {
        connection: vec![router::ConnectionInfo {
            pod_name: "app".into(),
            nsm_interface: "vl3-1".into(),
            nsm_ip: "10.1.1.5".into(),
            nsm_peer_ip: "10.1.1.1".into(),
        }],
    };
    let inner = [
        string_field(1, "app"),
        string_field(2, "vl3-1"),
        string_field(3, "10.1.1.5"),
        string_field(4, "10.1.1.1"),
    ]
    .concat();
    assert_wire(&info, &nested(1, &inner));
    assert_wire(
        &router::SidecarResponse {
            status_msg: "ok".into(),
        },
        &string_field(1, "ok"),
    );
}

#[test]
fn gw_pod_status_nested_messages_and_down_enum() {
    let msg = sidecar::GwPodStatus {
        node_ip: "192.0.2.10".into(),
        gateway_pod_ip: "10.244.0.7".into(),
        gateway_pod_name: "gw-0".into(),
        tunnel_status: Some(sidecar::TunnelInterfaceStatus {
            net_interface: "tun0".into(),
            local_ip: "10.9.0.1".into(),
            peer_ip: "10.9.0.2".into(),
            latency: 3,
            packet_loss: 100,
            status: sidecar::TunnelStatusType::GwTunnelStateDown as i32,
            ..Default::default()
        }),
        nsm_intf_status: Some(sidecar::NsmInterfaceStatus {
            nsm_interface_name: "nsm0".into(),
            nsm_ip: "10.1.1.1".into(),
        }),
    };
    let tunnel = [
        string_field(1, "tun0"),
        string_field(2, "10.9.0.1"),
        string_field(3, "10.9.0.2"),
        varint_field(4, 3),
        varint_field(7, 100),
        varint_field(8, 1), // GW_TUNNEL_STATE_DOWN = 1
    ]
    .concat();
    let nsm = [string_field(1, "nsm0"), string_field(2, "10.1.1.1")].concat();
    let expected = [
        string_field(1, "192.0.2.10"),
        string_field(2, "10.244.0.7"),
        string_field(3, "gw-0"),
        nested(4, &tunnel),
        nested(5, &nsm),
    ]
    .concat();
    assert_wire(&msg, &expected);
}

#[test]
fn tunnel_up_is_zero() {
    assert_eq!(sidecar::TunnelStatusType::GwTunnelStateUp as i32, 0);
    assert_eq!(sidecar::TunnelStatusType::GwTunnelStateDown as i32, 1);
    assert_eq!(
        sidecar::TunnelStatusType::GwTunnelStateDown.as_str_name(),
        "GW_TUNNEL_STATE_DOWN"
    );
}

#[test]
fn slice_qos_profile_class_type_field_5() {
    let msg = sidecar::SliceQosProfile {
        slice_name: "red".into(),
        tc_type: sidecar::TcType::BandwidthControl as i32,
        class_type: sidecar::ClassType::Tbf as i32,
        bw_ceiling: 50,
        bw_guaranteed: 10,
        priority: 2,
        dscp_class: "AF11".into(),
        ..Default::default()
    };
    let expected = [
        string_field(1, "red"),
        // tcType BANDWIDTH_CONTROL = 0 is the default: not on the wire.
        varint_field(5, 1), // ClassType TBF = 1
        varint_field(6, 50),
        varint_field(7, 10),
        varint_field(8, 2),
        string_field(9, "AF11"),
    ]
    .concat();
    assert_wire(&msg, &expected);
}

#[test]
fn gw_connection_context_high_field_numbers() {
    let msg = sidecar::SliceGwConnectionContext {
        remote_slice_gw_vpn_ip: "10.9.0.2".into(),
        remote_slice_gw_host_type: sidecar::SliceGwHostType::SliceGwClient as i32,
        remote_slice_gw_nsm_subnet: "10.2.0.0/16".into(),
        remote_slice_gw_node_port: "30000".into(),
        ..Default::default()
    };
    let expected = [
        vec![0x4a, 8], // field 9, length-delimited
        b"10.9.0.2".to_vec(),
        vec![0x50, 1], // field 10, varint
        vec![0x5a, 11],
        b"10.2.0.0/16".to_vec(),
        vec![0x6a, 5], // field 13
        b"30000".to_vec(),
    ]
    .concat();
    assert_wire(&msg, &expected);
    assert_wire(
        &sidecar::RemoteGwVpnIp {
            remote_gw_vpn_ip: "10.9.0.2".into(),
        },
        &string_field(1, "10.9.0.2"),
    );
}

#[test]
fn machine_driver_secret_map_entry() {
    let msg = machine_driver::MachineRequest {
        machine_json: "{}".into(),
        machine_class_json: String::new(),
        secret_data: [("k".to_string(), b"v".to_vec())].into_iter().collect(),
    };
    let entry = [string_field(1, "k"), string_field(2, "v")].concat();
    let expected = [string_field(1, "{}"), nested(3, &entry)].concat();
    assert_wire(&msg, &expected);
}
