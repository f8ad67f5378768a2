//! The reply and error strings of the sidecars' wire contracts, pinned to the literals of
//! `shared/spec/sidecar-protos.md` (KubeSlice's strings). The suites assert the literals on the
//! wire; this file checks that the code's constants are those literals, not the other way round.

use sidecar_shim::{gw, router};

#[test]
fn router_sidecar_strings_are_kubeslices() {
    assert_eq!(
        router::CONTEXT_UPDATED,
        "Slice Gw Connection Context Updated Successfully"
    );
    assert_eq!(router::ECMP_UPDATED, "Ecmp routes Updated Successfully");
    assert_eq!(
        router::INVALID_SUBNET,
        "Invalid Remote Slice Gateway Subnet"
    );
    assert_eq!(router::INVALID_NSM_IP, "Invalid NSM IP");
    assert_eq!(
        router::INVALID_NSM_IP_TO_REMOVE,
        "Invalid Nsm ip has been provided"
    );
    assert_eq!(router::kernel::CLIENT_NSM_INTERFACE, "nsm0");
}

#[test]
fn gateway_sidecar_strings_are_kubeslices() {
    assert_eq!(
        gw::CONNECTION_CONTEXT_UPDATED,
        "Connection Context Updated Successfully"
    );
    assert_eq!(gw::QOS_ENFORCED, "Slice QoS policy enforced successfully");
    assert_eq!(gw::INVALID_VPN_IP, "Invalid Remote Slice Gateway VPN IP");
    assert_eq!(gw::INVALID_SUBNET, "Invalid Remote Slice Gateway Subnet");
    assert_eq!(gw::CIDR_PARSE_ERROR, "Error in Parsing CIDR");
    assert_eq!(gw::NSM_INTERFACE, "nsm0");
    assert_eq!(gw::DEFAULT_PEER_PORT, 5000);
    assert_eq!(gw::tunnel::DOWN_AFTER_FULL_LOSS_CHECKS, 20);
}
