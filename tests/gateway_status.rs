//! gw-recycler's slice gateway reconciler against live gateway sidecars: a tunnel that goes DOWN
//! is announced by no API event, only by its sidecar's `GetStatus`. The real binary, asked again
//! every `--status-interval`, takes that gateway pod out of the router's next hops and
//! `gatewayPodStatus`, and puts it back when the tunnel comes UP again.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use capstan_apis::networking::SliceGateway;
use capstan_scenarios::slice::{
    NS, SERVER_BEFORE, SERVER_GW, SIDECAR_ADMIN_PORT, Testbed, WAIT, Worker, set_tunnel_down,
    set_unavailable,
};
use capstan_testkit::eventually;
use capstan_testkit::process::{BinaryUnderTest, http_get};
use kube::api::Api;

/// The tunnel state `gatewayPodStatus` publishes for the pod at `pod_ip`.
async fn published_tunnel_up(worker: &Worker, pod_ip: &str) -> Option<bool> {
    let api: Api<SliceGateway> = Api::namespaced(worker.cluster.client.clone(), NS);
    let gateway = api.get(SERVER_GW).await.ok()?;
    gateway
        .gateway_pods()
        .iter()
        .find(|p| p.pod_ip.as_deref() == Some(pod_ip))
        .map(|p| p.tunnel_up())
}

/// How many `GetStatus` calls the gw-sidecar at `pod_ip` has started (its admin `/metrics`).
async fn get_status_calls(pod_ip: &str) -> u64 {
    let admin: SocketAddr = format!("{pod_ip}:{SIDECAR_ADMIN_PORT}")
        .parse()
        .expect("admin address");
    let metrics = http_get(admin, "/metrics").await.expect("sidecar metrics");
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    metrics
        .body
        .lines()
        .find(|l| {
            l.starts_with("grpc_server_started_total") && l.contains(r#"grpc_method="GetStatus""#)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// The pod IP of the server's instance 0 gateway.
async fn instance_0_pod_ip(worker: &Worker) -> String {
    worker
        .pod_ips_of(SERVER_BEFORE[0])
        .await
        .into_iter()
        .next()
        .expect("a pod of instance 0")
}

/// The NSM IPs `gatewayPodStatus` publishes.
async fn published_nsm_ips(worker: &Worker) -> BTreeSet<String> {
    let api: Api<SliceGateway> = Api::namespaced(worker.cluster.client.clone(), NS);
    let gateway = api.get(SERVER_GW).await.expect("gateway");
    gateway
        .gateway_pods()
        .iter()
        .filter_map(|p| p.nsm_ip().map(str::to_owned))
        .collect()
}

/// Waits until every sidecar at `pod_ips` has been asked `more` more times than `since`.
async fn wait_asked(pod_ips: &[String], since: &[u64], more: u64) {
    eventually("the silent sidecars asked again", WAIT, || async {
        for (ip, before) in pod_ips.iter().zip(since) {
            if get_status_calls(ip).await < before + more {
                return None;
            }
        }
        Some(())
    })
    .await;
}

async fn calls_of(pod_ips: &[String]) -> Vec<u64> {
    let mut calls = Vec::new();
    for ip in pod_ips {
        calls.push(get_status_calls(ip).await);
    }
    calls
}

/// The server worker's gateways steady under a gw-recycler asking every `interval`: the testbed,
/// that recycler, the NSM IPs routed, and the pod IP of instance 0's gateway.
async fn steady(octet: u8, interval: &str) -> (Testbed, BinaryUnderTest, BTreeSet<String>, String) {
    let bed = Testbed::start(octet).await;
    let recycler = bed
        .server
        .spawn_recycler(&bed.hub, &["--status-interval", interval])
        .await;
    let nsm = bed
        .server
        .wait_steady(&SERVER_BEFORE, &BTreeSet::new())
        .await;
    let pod_ip = instance_0_pod_ip(&bed.server).await;
    (bed, recycler, nsm, pod_ip)
}

/// Waits until `gatewayPodStatus` shows the tunnel of the pod at `pod_ip` UP (or DOWN).
async fn wait_published(worker: &Worker, pod_ip: &str, up: bool) {
    let what = format!(
        "gatewayPodStatus showing the tunnel {}",
        if up { "UP" } else { "DOWN" }
    );
    eventually(&what, WAIT, || async {
        (published_tunnel_up(worker, pod_ip).await == Some(up)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_gone_down_leaves_the_router_next_hops_and_comes_back_when_up() {
    let (bed, _recycler, nsm, pod_ip) = steady(91, "1s").await;
    let down_nsm = bed.server.nsm_ips_of(SERVER_BEFORE[0]).await;
    let down_nsm = down_nsm.iter().next().expect("instance 0's NSM IP").clone();
    let other_nsm: Vec<&String> = nsm.iter().filter(|ip| **ip != down_nsm).collect();
    assert_eq!(other_nsm.len(), 1, "two gateways, two NSM IPs: {nsm:?}");
    assert_eq!(published_tunnel_up(&bed.server, &pod_ip).await, Some(true));

    // DOWN: only the sidecar says so.
    set_tunnel_down(&pod_ip, true).await;
    eventually(
        "the DOWN tunnel out of the router's next hops",
        WAIT,
        || async { (bed.server.routes_via(&down_nsm).await == Some(false)).then_some(()) },
    )
    .await;
    assert_eq!(bed.server.routes_via(other_nsm[0]).await, Some(true));
    wait_published(&bed.server, &pod_ip, false).await;

    // UP again: routed again.
    set_tunnel_down(&pod_ip, false).await;
    eventually(
        "the tunnel UP again back in the next hops",
        WAIT,
        || async { (bed.server.routes_via(&down_nsm).await == Some(true)).then_some(()) },
    )
    .await;
    wait_published(&bed.server, &pod_ip, true).await;
}

/// A tunnel that stays DOWN is not a pod coming up: once it has been DOWN for a status interval,
/// its sidecar is asked every interval, not on the one-second rungs of the probe ladder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_that_stays_down_is_asked_every_status_interval() {
    const INTERVAL: Duration = Duration::from_secs(3);
    const WINDOW: Duration = Duration::from_secs(6);
    let (bed, _recycler, _, pod_ip) = steady(94, "3s").await;
    set_tunnel_down(&pod_ip, true).await;
    wait_published(&bed.server, &pod_ip, false).await;
    // Past the interval, the pod's wait is no longer young.
    tokio::time::sleep(INTERVAL + Duration::from_millis(500)).await;
    let before = get_status_calls(&pod_ip).await;
    tokio::time::sleep(WINDOW).await;
    let asked = get_status_calls(&pod_ip).await - before;
    // Every 3 s over 6 s is 2 calls (3 at a window edge); the ladder's 1 s rungs would be 6.
    assert!(
        (1..=3).contains(&asked),
        "a DOWN sidecar asked {asked} times in {WINDOW:?} with a {INTERVAL:?} status interval"
    );
}

/// A sidecar hiccup is not a withdrawn gateway: while every gateway sidecar fails `GetStatus`,
/// the router keeps routing via both gateways and `gatewayPodStatus` keeps their NSM IPs, from
/// the last answers the running reconciler kept and, after a restart of the recycler, from what
/// it had published. Before, each failing pass published the pods without NSM IP and pushed an
/// empty next-hop list, and the remote subnet lost its route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_whose_sidecars_stop_answering_keep_their_routes_and_status() {
    let (bed, recycler, nsm, _) = steady(100, "1s").await;
    assert_eq!(nsm.len(), 2, "two gateways, two NSM IPs: {nsm:?}");
    let mut pod_ips = Vec::new();
    for deployment in SERVER_BEFORE {
        pod_ips.extend(bed.server.pod_ips_of(deployment).await);
    }
    assert_eq!(pod_ips.len(), 2, "{pod_ips:?}");
    eventually("both NSM IPs published", WAIT, || async {
        (published_nsm_ips(&bed.server).await == nsm).then_some(())
    })
    .await;

    let down_nsm = bed.server.nsm_ips_of(SERVER_BEFORE[0]).await;
    let down_nsm = down_nsm.into_iter().next().expect("instance 0's NSM IP");
    let down_ip = instance_0_pod_ip(&bed.server).await;
    for ip in &pod_ips {
        set_unavailable(ip, true).await;
    }
    let still_routed = || async {
        for ip in &nsm {
            assert_eq!(
                bed.server.routes_via(ip).await,
                Some(true),
                "the route via {ip} withdrawn while the sidecars did not answer"
            );
        }
        assert_eq!(published_nsm_ips(&bed.server).await, nsm);
    };
    // Several passes of the running recycler (a 1 s status interval) with no answer.
    let before = calls_of(&pod_ips).await;
    wait_asked(&pod_ips, &before, 3).await;
    still_routed().await;

    // A restarted recycler has no answers in memory: what it published stands.
    drop(recycler);
    let _recycler = bed
        .server
        .spawn_recycler(&bed.hub, &["--status-interval", "1s"])
        .await;
    let before = calls_of(&pod_ips).await;
    wait_asked(&pod_ips, &before, 3).await;
    still_routed().await;

    // Answering again, DOWN: now the sidecar said so, and that gateway leaves the next hops.
    for ip in &pod_ips {
        set_unavailable(ip, false).await;
    }
    set_tunnel_down(&down_ip, true).await;
    eventually("the DOWN tunnel out of the next hops", WAIT, || async {
        (bed.server.routes_via(&down_nsm).await == Some(false)).then_some(())
    })
    .await;
    for ip in nsm.iter().filter(|ip| **ip != down_nsm) {
        assert_eq!(bed.server.routes_via(ip).await, Some(true), "{ip}");
    }
}
