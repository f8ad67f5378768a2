//! One behaviour suite for `router.SliceRouterSidecarService`, run against both
//! backends through a real tonic client over TCP. The kernel variant runs the
//! backend in a fresh network namespace and checks the routing table
//! independently with `ip -j route` after each call.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::{
    ConnectionInfo, EcmpUpdateInfo, SliceGwConContext, VerifyRouteAddRequest,
};
use common::{Netns, ServerGuard, set};
use sidecar_shim::router::kernel::KernelRouter;
use sidecar_shim::router::memory::MemoryRouter;
use sidecar_shim::router::{RouterBackend, RouterSidecar};
use tonic::Code;
use tonic::transport::Channel;

const SUBNET: &str = "10.2.0.0/16";

enum View {
    Memory(Arc<MemoryRouter>),
    Kernel(Netns),
}

struct Harness {
    client: SliceRouterSidecarServiceClient<Channel>,
    view: View,
    _server: ServerGuard,
}

impl Harness {
    /// Routes with gateways: from `ip -j route` (kernel) or the table (memory).
    fn routes(&self) -> BTreeMap<String, BTreeSet<String>> {
        match &self.view {
            View::Kernel(netns) => netns.gateway_routes(),
            View::Memory(memory) => memory
                .routes()
                .into_iter()
                .map(|(dst, hops)| {
                    (
                        dst.to_string(),
                        hops.iter().map(ToString::to_string).collect(),
                    )
                })
                .collect(),
        }
    }

    fn route(&self, dst: &str) -> Option<BTreeSet<String>> {
        self.routes().remove(dst)
    }

    async fn update(&mut self, subnet: &str, hops: &[&str]) -> Result<String, tonic::Status> {
        let request = SliceGwConContext {
            remote_slice_gw_nsm_subnet: subnet.into(),
            local_nsm_gw_peer_ip_list: hops.iter().map(|s| (*s).to_owned()).collect(),
            slice_id: "red".into(),
            ..Default::default()
        };
        let reply = self
            .client
            .update_slice_gw_connection_context(request)
            .await?;
        Ok(reply.into_inner().status_msg)
    }

    async fn present(&mut self, dst: &str, nsm_ip: &str) -> Result<bool, tonic::Status> {
        let request = VerifyRouteAddRequest {
            dst_ip: dst.into(),
            nsm_ip: nsm_ip.into(),
        };
        Ok(self
            .client
            .get_route_in_kernel(request)
            .await?
            .into_inner()
            .is_route_present)
    }

    async fn remove(&mut self, subnet: &str, nsm_ip: &str) -> Result<String, tonic::Status> {
        let request = EcmpUpdateInfo {
            remote_slice_gw_nsm_subnet: subnet.into(),
            nsm_ip_to_remove: nsm_ip.into(),
        };
        Ok(self
            .client
            .update_ecmp_routes(request)
            .await?
            .into_inner()
            .status_msg)
    }
}

/// The clients both backends know about: `vl3-app` (alias app-pod, 10.1.2.2/30) and
/// `vl3-web` (no alias, 10.1.3.1 peer 10.1.3.9).
fn expected_connections() -> Vec<ConnectionInfo> {
    vec![
        ConnectionInfo {
            pod_name: "app-pod".into(),
            nsm_interface: "nsm0".into(),
            nsm_ip: "10.1.2.1".into(),
            nsm_peer_ip: "10.1.2.2".into(),
        },
        ConnectionInfo {
            pod_name: "vl3-web".into(),
            nsm_interface: "nsm0".into(),
            nsm_ip: "10.1.3.9".into(),
            nsm_peer_ip: "10.1.3.1".into(),
        },
    ]
}

async fn harness(backend: Arc<dyn RouterBackend>, view: View) -> Harness {
    let server = common::serve(RouterSidecar::new(backend).into_server()).await;
    let client = SliceRouterSidecarServiceClient::new(common::channel(server.addr).await);
    Harness {
        client,
        view,
        _server: server,
    }
}

async fn memory_harness() -> Harness {
    let memory = Arc::new(MemoryRouter::new(expected_connections()));
    harness(memory.clone(), View::Memory(memory)).await
}

async fn kernel_harness() -> Option<Harness> {
    let netns = common::netns()?;
    // Next hops 10.1.1.2-4 are on-link through v0.
    netns.veth("v0", "v1", Some("10.1.1.1/24"));
    // Client links.
    netns.veth("vl3-app", "client-app", Some("10.1.2.2/30"));
    netns.ip(&["link", "set", "vl3-app", "alias", "app-pod"]);
    netns.ip(&[
        "link",
        "add",
        "vl3-web",
        "type",
        "veth",
        "peer",
        "name",
        "client-web",
    ]);
    netns.ip(&[
        "addr", "add", "10.1.3.1", "peer", "10.1.3.9", "dev", "vl3-web",
    ]);
    // A link with two addresses is skipped, as KubeSlice does.
    netns.veth("vl3-multi", "client-multi", Some("10.1.4.2/30"));
    netns.ip(&["addr", "add", "10.1.5.2/30", "dev", "vl3-multi"]);
    let backend = KernelRouter::connect(Some(&netns.path())).expect("netlink in test namespace");
    Some(harness(Arc::new(backend), View::Kernel(netns)).await)
}

async fn install_replace_shrink_delete(h: &mut Harness) {
    assert_eq!(
        h.update(SUBNET, &["10.1.1.2", "10.1.1.3"])
            .await
            .expect("install"),
        "Slice Gw Connection Context Updated Successfully"
    );
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.2", "10.1.1.3"])));

    // The same set again changes nothing.
    h.update(SUBNET, &["10.1.1.3", "10.1.1.2"])
        .await
        .expect("same set");
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.2", "10.1.1.3"])));

    h.update(SUBNET, &["10.1.1.3", "10.1.1.4"])
        .await
        .expect("replace");
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.3", "10.1.1.4"])));

    h.update(SUBNET, &["10.1.1.4"]).await.expect("shrink");
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.4"])));

    h.update(SUBNET, &["10.1.1.2", "10.1.1.3", "10.1.1.4"])
        .await
        .expect("grow");
    assert_eq!(
        h.route(SUBNET),
        Some(set(&["10.1.1.2", "10.1.1.3", "10.1.1.4"]))
    );

    // Host bits are ignored, as Go's net.ParseCIDR does.
    h.update("10.2.9.9/16", &["10.1.1.2"])
        .await
        .expect("non-canonical subnet");
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.2"])));

    // A second subnet is independent.
    h.update("10.3.0.0/16", &["10.1.1.3"])
        .await
        .expect("second subnet");
    assert_eq!(h.route("10.3.0.0/16"), Some(set(&["10.1.1.3"])));

    assert_eq!(
        h.update(SUBNET, &[]).await.expect("delete"),
        "Slice Gw Connection Context Updated Successfully"
    );
    assert_eq!(h.route(SUBNET), None);
    h.update(SUBNET, &[]).await.expect("delete again is fine");
    assert_eq!(h.route(SUBNET), None);
    assert_eq!(h.route("10.3.0.0/16"), Some(set(&["10.1.1.3"])));
}

async fn get_route_in_kernel(h: &mut Harness) {
    assert!(!h.present(SUBNET, "10.1.1.2").await.expect("no route yet"));
    h.update(SUBNET, &["10.1.1.2", "10.1.1.3"])
        .await
        .expect("install");
    assert!(h.present(SUBNET, "10.1.1.2").await.expect("query"));
    assert!(h.present(SUBNET, "10.1.1.3").await.expect("query"));
    assert!(!h.present(SUBNET, "10.1.1.4").await.expect("query"));
    assert!(
        h.present("10.2.7.7/16", "10.1.1.2")
            .await
            .expect("canonical dst")
    );
    assert!(
        !h.present("10.2.0.0/24", "10.1.1.2")
            .await
            .expect("other prefix length")
    );
    assert!(
        !h.present("10.9.0.0/16", "10.1.1.2")
            .await
            .expect("other subnet")
    );
}

async fn ecmp_removal(h: &mut Harness) {
    h.update(SUBNET, &["10.1.1.2", "10.1.1.3", "10.1.1.4"])
        .await
        .expect("install");

    assert_eq!(
        h.remove(SUBNET, "10.1.1.3").await.expect("remove one"),
        "Ecmp routes Updated Successfully"
    );
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.2", "10.1.1.4"])));
    assert!(!h.present(SUBNET, "10.1.1.3").await.expect("query"));

    assert_eq!(
        h.remove(SUBNET, "10.1.1.9").await.expect("absent hop"),
        "Ecmp routes Updated Successfully"
    );
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.2", "10.1.1.4"])));

    h.remove(SUBNET, "10.1.1.2").await.expect("remove another");
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.4"])));

    h.remove(SUBNET, "10.1.1.4").await.expect("remove the last");
    assert_eq!(h.route(SUBNET), None);

    assert_eq!(
        h.remove(SUBNET, "10.1.1.4").await.expect("route gone"),
        "Ecmp routes Updated Successfully"
    );
    assert_eq!(h.route(SUBNET), None);
}

async fn connection_info(h: &mut Harness) {
    let info = h
        .client
        .get_slice_router_client_connection_info(())
        .await
        .expect("connection info")
        .into_inner();
    assert_eq!(info.connection, expected_connections());
}

async fn invalid_requests_change_nothing(h: &mut Harness) {
    h.update(SUBNET, &["10.1.1.2"]).await.expect("install");
    let before = h.routes();

    let cases: Vec<(&str, Result<String, tonic::Status>, &str)> = vec![
        (
            "ctx: empty subnet",
            h.update("", &["10.1.1.3"]).await,
            "Invalid Remote Slice Gateway Subnet",
        ),
        (
            "ctx: subnet without prefix",
            h.update("10.2.0.0", &["10.1.1.3"]).await,
            "Invalid Remote Slice Gateway Subnet",
        ),
        (
            "ctx: prefix too long",
            h.update("10.2.0.0/33", &["10.1.1.3"]).await,
            "Invalid Remote Slice Gateway Subnet",
        ),
        (
            "ctx: garbage subnet",
            h.update("subnet", &[]).await,
            "Invalid Remote Slice Gateway Subnet",
        ),
        (
            "ctx: bad peer IP",
            h.update(SUBNET, &["10.1.1.3", "10.1.1"]).await,
            "Invalid Local NSM Gateway Peer IP",
        ),
        (
            "ctx: empty peer IP",
            h.update(SUBNET, &[""]).await,
            "Invalid Local NSM Gateway Peer IP",
        ),
        (
            "ctx: IPv6 hop for IPv4 subnet",
            h.update(SUBNET, &["fd00::2"]).await,
            "Invalid Local NSM Gateway Peer IP",
        ),
        (
            "ecmp: empty subnet",
            h.remove("", "10.1.1.2").await,
            "Invalid Remote Slice Gateway Subnet",
        ),
        (
            "ecmp: bad subnet",
            h.remove("10.2.0.0/x", "10.1.1.2").await,
            "Invalid Remote Slice Gateway Subnet",
        ),
        (
            "ecmp: empty nsm ip",
            h.remove(SUBNET, "").await,
            "Invalid Nsm ip has been provided",
        ),
        (
            "ecmp: bad nsm ip",
            h.remove(SUBNET, "10.1.1.").await,
            "Invalid Nsm ip has been provided",
        ),
    ];
    for (case, result, message) in cases {
        let status = result.expect_err(case);
        assert_eq!(status.code(), Code::InvalidArgument, "{case}");
        assert_eq!(status.message(), message, "{case}");
    }

    let queries = [
        ("", "10.1.1.2", "Invalid Remote Slice Gateway Subnet"),
        (SUBNET, "", "Invalid NSM IP"),
        ("", "", "Invalid Remote Slice Gateway Subnet"),
        (
            "10.2.0.0/99",
            "10.1.1.2",
            "Invalid Remote Slice Gateway Subnet",
        ),
        (SUBNET, "nsm", "Invalid NSM IP"),
    ];
    for (dst, nsm, message) in queries {
        let status = h.present(dst, nsm).await.expect_err("invalid query");
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, message),
            "{dst:?} {nsm:?}"
        );
    }

    assert_eq!(
        h.routes(),
        before,
        "invalid requests must not change routes"
    );
}

/// Many calls at once: reads never see a half-applied change and netlink requests
/// do not trip over each other.
async fn concurrent_calls(h: &mut Harness) {
    h.update(SUBNET, &["10.1.1.2", "10.1.1.3"])
        .await
        .expect("install");
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..48_u32 {
        let mut client = h.client.clone();
        calls.spawn(async move {
            if i.is_multiple_of(4) {
                let hops = if i.is_multiple_of(8) {
                    vec!["10.1.1.2".to_owned(), "10.1.1.3".to_owned()]
                } else {
                    vec!["10.1.1.3".to_owned(), "10.1.1.2".to_owned()]
                };
                let request = SliceGwConContext {
                    remote_slice_gw_nsm_subnet: SUBNET.into(),
                    local_nsm_gw_peer_ip_list: hops,
                    ..Default::default()
                };
                client
                    .update_slice_gw_connection_context(request)
                    .await
                    .map(|_| true)
            } else {
                let request = VerifyRouteAddRequest {
                    dst_ip: SUBNET.into(),
                    nsm_ip: "10.1.1.2".into(),
                };
                client
                    .get_route_in_kernel(request)
                    .await
                    .map(|r| r.into_inner().is_route_present)
            }
        });
    }
    while let Some(result) = calls.join_next().await {
        assert!(
            result.expect("task").expect("call succeeds"),
            "route present throughout"
        );
    }
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.2", "10.1.1.3"])));
}

common::both_backends!(
    install_replace_shrink_delete,
    get_route_in_kernel,
    ecmp_removal,
    connection_info,
    invalid_requests_change_nothing,
    concurrent_calls,
);

/// Kernel only: an unreachable next hop is an `Internal` error with the kernel's
/// reason, and the route stays as it was.
#[tokio::test]
async fn kernel_failure_is_internal_and_changes_nothing() {
    let Some(mut h) = kernel_harness().await else {
        return;
    };
    h.update(SUBNET, &["10.1.1.2"]).await.expect("install");
    let status = h
        .update(SUBNET, &["10.1.1.2", "10.99.0.1"])
        .await
        .expect_err("10.99.0.1 is not reachable from any link");
    assert_eq!(status.code(), Code::Internal);
    assert!(
        status.message().contains("10.99.0.1"),
        "reason names the hop: {}",
        status.message()
    );
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.2"])));
}

/// Routes that others installed (e.g. with `ip route`) are read and replaced too.
#[tokio::test]
async fn kernel_reads_routes_installed_by_others() {
    let Some(mut h) = kernel_harness().await else {
        return;
    };
    let View::Kernel(netns) = &h.view else {
        unreachable!("kernel harness")
    };
    netns.ip(&[
        "route", "add", SUBNET, "nexthop", "via", "10.1.1.2", "nexthop", "via", "10.1.1.3",
    ]);
    assert!(h.present(SUBNET, "10.1.1.3").await.expect("query"));
    h.remove(SUBNET, "10.1.1.2").await.expect("remove");
    assert_eq!(h.route(SUBNET), Some(set(&["10.1.1.3"])));
    h.update(SUBNET, &[]).await.expect("delete");
    assert_eq!(h.route(SUBNET), None);
}

/// Kernel only: route reads are answered from a cache of the route table, so routes added or
/// deleted outside the sidecar after a first read must reach the next read.
#[tokio::test]
async fn kernel_reads_follow_route_changes_made_outside_the_sidecar() {
    let Some(mut h) = kernel_harness().await else {
        return;
    };
    assert!(!h.present(SUBNET, "10.1.1.2").await.expect("no route yet"));
    let View::Kernel(netns) = &h.view else {
        unreachable!("kernel harness")
    };
    netns.ip(&["route", "add", SUBNET, "via", "10.1.1.2"]);
    assert!(h.present(SUBNET, "10.1.1.2").await.expect("added outside"));
    let View::Kernel(netns) = &h.view else {
        unreachable!("kernel harness")
    };
    netns.ip(&["route", "del", SUBNET]);
    assert!(
        !h.present(SUBNET, "10.1.1.2")
            .await
            .expect("deleted outside")
    );
}
