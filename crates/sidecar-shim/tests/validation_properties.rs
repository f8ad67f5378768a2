//! Property tests of the sidecars' pure validation and planning: no gRPC request panics, an
//! invalid one is refused with the message of the field at fault, and planning reaches the
//! desired next hops.

use std::collections::BTreeSet;
use std::net::IpAddr;

use capstan_proto::router::{EcmpUpdateInfo, SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::{SliceGwConnectionContext, SliceQosProfile};
use proptest::prelude::*;
use sidecar_shim::gw::{self, validate_connection_context, validate_qos};
use sidecar_shim::router::{
    self, NextHops, RouteChange, plan_next_hops, plan_removal, validate_context,
    validate_ecmp_removal, validate_route_query,
};

/// Addresses and prefixes, mostly well-formed, often not.
fn address_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|b| IpAddr::from(b).to_string()),
        any::<[u16; 8]>().prop_map(|b| IpAddr::from(b).to_string()),
        (any::<[u8; 4]>(), 0u16..300).prop_map(|(b, p)| format!("{}/{p}", IpAddr::from(b))),
        (any::<[u16; 8]>(), 0u16..300).prop_map(|(b, p)| format!("{}/{p}", IpAddr::from(b))),
        "\\PC{0,24}",
        "[0-9./:]{0,24}",
    ]
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u16; 8]>().prop_map(IpAddr::from)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn gateway_context_never_panics(vpn in address_text(), subnet in address_text()) {
        let req = SliceGwConnectionContext {
            remote_slice_gw_vpn_ip: vpn,
            remote_slice_gw_nsm_subnet: subnet,
            ..Default::default()
        };
        if let Err(e) = validate_connection_context(&req) {
            prop_assert!([gw::INVALID_VPN_IP, gw::INVALID_SUBNET, gw::CIDR_PARSE_ERROR].contains(&e.0));
        }
    }

    #[test]
    fn qos_profiles_never_panic(tc in any::<i32>(), class in any::<i32>(), ceiling in any::<u32>(),
            guaranteed in any::<u32>(), priority in any::<u32>(), dscp in "\\PC{0,30}") {
        let profile = SliceQosProfile {
            tc_type: tc,
            class_type: class,
            bw_ceiling: ceiling,
            bw_guaranteed: guaranteed,
            priority,
            dscp_class: dscp,
            ..Default::default()
        };
        match validate_qos(&profile) {
            Ok(()) => prop_assert!(priority <= 7 && ceiling > 0 && guaranteed <= ceiling),
            Err(e) => prop_assert!([
                gw::INVALID_TC_TYPE, gw::INVALID_CLASS_TYPE, gw::INVALID_BANDWIDTH,
                gw::INVALID_PRIORITY, gw::INVALID_DSCP_CLASS,
            ].contains(&e.0)),
        }
    }

    #[test]
    fn router_requests_never_panic(subnet in address_text(), peers in prop::collection::vec(address_text(), 0..4),
            nsm in address_text(), dst in address_text()) {
        let context = SliceGwConContext {
            remote_slice_gw_nsm_subnet: subnet.clone(),
            local_nsm_gw_peer_ip_list: peers,
            ..Default::default()
        };
        if let Err(e) = validate_context(&context) {
            prop_assert!([router::INVALID_SUBNET, router::INVALID_PEER_IP].contains(&e.0));
        }
        let query = VerifyRouteAddRequest { nsm_ip: nsm.clone(), dst_ip: dst };
        if let Err(e) = validate_route_query(&query) {
            prop_assert!([router::INVALID_SUBNET, router::INVALID_NSM_IP].contains(&e.0));
        }
        let removal = EcmpUpdateInfo { remote_slice_gw_nsm_subnet: subnet, nsm_ip_to_remove: nsm };
        if let Err(e) = validate_ecmp_removal(&removal) {
            prop_assert!([router::INVALID_SUBNET, router::INVALID_NSM_IP_TO_REMOVE].contains(&e.0));
        }
    }

    #[test]
    fn planning_reaches_the_desired_next_hops(current in prop::option::of(prop::collection::btree_set(ip(), 0..4)),
            desired in prop::collection::btree_set(ip(), 0..4), remove in ip()) {
        let apply = |current: Option<&NextHops>, change: RouteChange| -> Option<NextHops> {
            match change {
                RouteChange::Keep => current.cloned(),
                RouteChange::Replace(hops) => Some(hops),
                RouteChange::Remove => None,
            }
        };
        let after = apply(current.as_ref(), plan_next_hops(current.as_ref(), &desired));
        prop_assert_eq!(after.unwrap_or_default(), desired);
        let after = apply(current.as_ref(), plan_removal(current.as_ref(), remove));
        let mut expected: BTreeSet<IpAddr> = current.clone().unwrap_or_default();
        expected.remove(&remove);
        prop_assert_eq!(after.unwrap_or_default(), expected);
    }
}
