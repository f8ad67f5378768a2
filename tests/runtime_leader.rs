//! capstan-runtime's leader election against kube-sim: hand-over between replicas, release on
//! drain, fail-stop when a held lease is taken away. It lives here, not in the runtime's tests,
//! because kube-sim depends on the runtime (a runtime test on kube-sim would be a cycle).

use std::time::Duration;

use capstan_runtime::cli::{CommonArgs, LeaderElectionArgs, LogFormat};
use capstan_runtime::leader::{LeaderElection, LeaderHandle, LeadershipEnd};
use capstan_runtime::service::Service;
use capstan_runtime::shutdown::Shutdown;
use capstan_testkit::lease::{holder, take_over};
use capstan_testkit::process::http_get;
use capstan_testkit_sim::SimCluster;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use prometheus_client::registry::Registry;

const WAIT: Duration = Duration::from_secs(15);

fn election(identity: &str, lease: &str) -> LeaderElectionArgs {
    LeaderElectionArgs {
        leader_elect: true,
        lease_name: Some(lease.into()),
        lease_namespace: "default".into(),
        // Short so that renewals (every duration - grace) happen within the test.
        lease_duration_seconds: 3,
        lease_grace_seconds: 1,
        identity: Some(identity.into()),
    }
}

/// The Leases the elections here use (`lease_namespace` of [`election`]).
fn leases(cluster: &SimCluster) -> Api<Lease> {
    Api::namespaced(cluster.client.clone(), "default")
}

async fn start(
    cluster: &SimCluster,
    identity: &str,
    lease: &str,
    shutdown: Shutdown,
) -> LeaderHandle {
    LeaderElection::start(
        Some(cluster.client.clone()),
        &election(identity, lease),
        "unused-default",
        shutdown,
    )
    .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_when_the_leader_releases() {
    let cluster = SimCluster::start().await;
    let leases = leases(&cluster);
    let first = start(&cluster, "replica-a", "handover", Shutdown::new()).await;
    assert!(
        tokio::time::timeout(WAIT, first.acquired())
            .await
            .expect("in time"),
        "the only replica leads"
    );
    assert_eq!(
        holder(&leases, "handover").await.as_deref(),
        Some("replica-a")
    );

    let second = start(&cluster, "replica-b", "handover", Shutdown::new()).await;
    // Longer than a renewal period: the holder keeps the lease, the standby waits.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(first.is_leader() && !second.is_leader());
    assert_eq!(
        holder(&leases, "handover").await.as_deref(),
        Some("replica-a")
    );

    assert_eq!(
        first.release().await.expect("releases"),
        LeadershipEnd::Released
    );
    assert!(!first.is_leader() && !first.was_lost());
    assert!(
        tokio::time::timeout(WAIT, second.acquired())
            .await
            .expect("in time"),
        "the standby takes over after the release"
    );
    assert_eq!(
        holder(&leases, "handover").await.as_deref(),
        Some("replica-b")
    );
    assert_eq!(
        second.release().await.expect("releases"),
        LeadershipEnd::Released
    );
    assert_eq!(holder(&leases, "handover").await, None, "released on drain");
    cluster.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_never_led_reports_standby() {
    let cluster = SimCluster::start().await;
    let leases = leases(&cluster);
    let leader = start(&cluster, "replica-a", "standby", Shutdown::new()).await;
    assert!(
        tokio::time::timeout(WAIT, leader.acquired())
            .await
            .expect("in time")
    );
    let standby_shutdown = Shutdown::new();
    let standby = start(&cluster, "replica-b", "standby", standby_shutdown.clone()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    standby_shutdown.trigger();
    assert!(
        !standby.acquired().await,
        "shutdown ends the wait without leadership"
    );
    assert_eq!(
        standby.release().await.expect("stops"),
        LeadershipEnd::Standby
    );
    assert_eq!(
        holder(&leases, "standby").await.as_deref(),
        Some("replica-a"),
        "untouched"
    );
    leader.release().await.expect("releases");
    cluster.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_held_lease_triggers_shutdown_and_an_error() {
    let cluster = SimCluster::start().await;
    let leases = leases(&cluster);
    let shutdown = Shutdown::new();
    let handle = start(&cluster, "replica-a", "stolen", shutdown.clone()).await;
    assert!(
        tokio::time::timeout(WAIT, handle.acquired())
            .await
            .expect("in time")
    );

    // Another holder takes the lease (as after a partition where our renewals did not land).
    take_over(&leases, "stolen", "intruder").await;

    tokio::time::timeout(WAIT, shutdown.cancelled())
        .await
        .expect("the loss triggers shutdown");
    assert!(handle.was_lost());
    assert!(!handle.is_leader(), "writes stop at once");
    let error = handle
        .release()
        .await
        .expect_err("a lost lease is an error");
    assert!(
        matches!(&error, capstan_runtime::RuntimeError::LeaseLost { lease } if lease == "stolen"),
        "{error}"
    );
    assert_eq!(
        holder(&leases, "stolen").await.as_deref(),
        Some("intruder"),
        "not released by us"
    );
    cluster.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_exposes_leadership_and_releases_the_lease_on_drain() {
    let cluster = SimCluster::start().await;
    let leases = leases(&cluster);
    let args = CommonArgs {
        kubeconfig: Some(cluster.kubeconfig_path().into()),
        metrics_addr: "127.0.0.1:0".parse().expect("address"),
        log_format: LogFormat::Text,
        log_level: "info".into(),
        otlp_endpoint: None,
        leader: LeaderElectionArgs {
            lease_name: None,
            ..election("pod-0", "ignored")
        },
    };
    let shutdown = Shutdown::new();
    // No client passed: the service builds one from --kubeconfig because election is on.
    let service = Service::start(
        "svc-under-test",
        &args,
        Registry::default(),
        None,
        shutdown.clone(),
    )
    .await
    .expect("starts");
    let addr = service.admin_addr();
    assert!(
        tokio::time::timeout(WAIT, service.leader().acquired())
            .await
            .expect("in time")
    );
    assert_eq!(
        holder(&leases, "svc-under-test").await.as_deref(),
        Some("pod-0"),
        "the lease is named after the service by default"
    );
    let mut gauge = String::new();
    for _ in 0..50 {
        gauge = http_get(addr, "/metrics").await.expect("metrics").body;
        if gauge.contains("capstan_leader 1\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gauge.contains("capstan_leader 1\n"), "{gauge}");

    shutdown.trigger();
    service
        .run(shutdown.token().cancelled_owned())
        .await
        .expect("drains");
    assert_eq!(
        holder(&leases, "svc-under-test").await,
        None,
        "released on drain"
    );
    cluster.sim.shutdown().await;
}
