//! The built binary with `--leader-elect` against kube-sim: it takes the Lease, releases it on
//! SIGTERM (exit 0), and exits non-zero by itself when the Lease is taken away.

mod common;

use std::time::Duration;

use capstan_testkit::eventually_with;
use capstan_testkit::lease::{holder, take_over, wait_for_holder};
use capstan_testkit::process::{BinaryUnderTest, http_get};
use capstan_testkit_sim::SimCluster;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use common::BIN;

const WAIT: Duration = Duration::from_secs(20);
/// The Lease is named after the binary by default.
const LEASE: &str = "machineclass-controller";

async fn spawn_elected(cluster: &SimCluster) -> BinaryUnderTest {
    cluster
        .spawn(BIN, &common::leader_elect_args("pod-a"))
        .await
}

/// Waits until the Lease names `pod-a` and the process itself reports leading (its
/// `capstan_leader` gauge): the Lease write lands before the process learns it leads, and a
/// SIGTERM or a takeover in between would find a process that never led.
async fn wait_leading(bin: &BinaryUnderTest, leases: &Api<Lease>) {
    wait_for_holder(leases, LEASE, "pod-a", WAIT).await;
    eventually_with(
        "capstan_leader 1",
        WAIT,
        || bin.output().join("\n"),
        || async {
            let metrics = http_get(bin.admin_addr(), "/metrics").await.ok()?.body;
            metrics.contains("capstan_leader 1\n").then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_the_lease_and_releases_it_on_sigterm() {
    let cluster = SimCluster::start().await;
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), "default");
    let mut bin = spawn_elected(&cluster).await;

    wait_leading(&bin, &leases).await;

    bin.sigterm().expect("signal delivered");
    let status = bin.wait_exit(WAIT).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", bin.output().join("\n"));
    assert_eq!(holder(&leases, LEASE).await, None, "released");
    cluster.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_non_zero_when_the_lease_is_taken_away() {
    let cluster = SimCluster::start().await;
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), "default");
    let mut bin = spawn_elected(&cluster).await;
    wait_leading(&bin, &leases).await;

    take_over(&leases, LEASE, "intruder").await;

    let status = bin.wait_exit(WAIT).await.expect("exits by itself");
    let output = bin.output().join("\n");
    assert!(!status.success(), "fail-stop exits non-zero: {output}");
    assert!(output.contains("leadership lost"), "{output}");
    assert_eq!(
        holder(&leases, LEASE).await.as_deref(),
        Some("intruder"),
        "the new holder keeps it"
    );
    cluster.sim.shutdown().await;
}

#[tokio::test]
async fn a_dead_trace_collector_does_not_block_the_drain() {
    // The controller needs a cluster to start; kube-sim stands in.
    let cluster = SimCluster::start().await;
    let mut bin = cluster
        .spawn(BIN, &["--otlp-endpoint", "http://127.0.0.1:9"])
        .await;
    assert_eq!(
        http_get(bin.admin_addr(), "/livez")
            .await
            .expect("livez")
            .status,
        200
    );
    bin.sigterm().expect("signal delivered");
    let status = bin.wait_exit(WAIT).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", bin.output().join("\n"));
}
