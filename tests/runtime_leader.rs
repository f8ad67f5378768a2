//! capstan-runtime's leader election against kube-sim: hand-over between replicas, release on
//! drain, fail-stop when a held lease is taken away. It lives here, not in the runtime's tests,
//! because kube-sim depends on the runtime (a runtime test on kube-sim would be a cycle).

use std::time::Duration;

use capstan_runtime::cli::{CommonArgs, LeaderElectionArgs, LogFormat};
use capstan_runtime::leader::{LeaderElection, LeaderHandle, LeadershipEnd};
use capstan_runtime::service::Service;
use capstan_runtime::shutdown::Shutdown;
use capstan_testkit::process::http_get;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_sim::{Config, KubeSim};
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

async fn holder(sim: &KubeSim, lease: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(sim.client().expect("client"), "default");
    let lease = leases.get(lease).await.expect("lease exists");
    lease.spec.and_then(|spec| spec.holder_identity)
}

async fn start(sim: &KubeSim, identity: &str, lease: &str, shutdown: Shutdown) -> LeaderHandle {
    LeaderElection::start(
        Some(sim.client().expect("client")),
        &election(identity, lease),
        "unused-default",
        shutdown,
    )
    .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_when_the_leader_releases() {
    let sim = KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts");
    let first = start(&sim, "replica-a", "handover", Shutdown::new()).await;
    assert!(
        tokio::time::timeout(WAIT, first.acquired())
            .await
            .expect("in time"),
        "the only replica leads"
    );
    assert_eq!(holder(&sim, "handover").await.as_deref(), Some("replica-a"));

    let second = start(&sim, "replica-b", "handover", Shutdown::new()).await;
    // Longer than a renewal period: the holder keeps the lease, the standby waits.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(first.is_leader() && !second.is_leader());
    assert_eq!(holder(&sim, "handover").await.as_deref(), Some("replica-a"));

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
    assert_eq!(holder(&sim, "handover").await.as_deref(), Some("replica-b"));
    assert_eq!(
        second.release().await.expect("releases"),
        LeadershipEnd::Released
    );
    assert_eq!(holder(&sim, "handover").await, None, "released on drain");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_never_led_reports_standby() {
    let sim = KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts");
    let leader = start(&sim, "replica-a", "standby", Shutdown::new()).await;
    assert!(
        tokio::time::timeout(WAIT, leader.acquired())
            .await
            .expect("in time")
    );
    let standby_shutdown = Shutdown::new();
    let standby = start(&sim, "replica-b", "standby", standby_shutdown.clone()).await;
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
        holder(&sim, "standby").await.as_deref(),
        Some("replica-a"),
        "untouched"
    );
    leader.release().await.expect("releases");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_held_lease_triggers_shutdown_and_an_error() {
    let sim = KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts");
    let shutdown = Shutdown::new();
    let handle = start(&sim, "replica-a", "stolen", shutdown.clone()).await;
    assert!(
        tokio::time::timeout(WAIT, handle.acquired())
            .await
            .expect("in time")
    );

    // Another holder takes the lease (as after a partition where our renewals did not land).
    let leases: Api<Lease> = Api::namespaced(sim.client().expect("client"), "default");
    let takeover = serde_json::json!({
        "spec": {
            "holderIdentity": "intruder",
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
            "leaseDurationSeconds": 30,
        }
    });
    leases
        .patch("stolen", &PatchParams::default(), &Patch::Merge(&takeover))
        .await
        .expect("takeover patch");

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
        holder(&sim, "stolen").await.as_deref(),
        Some("intruder"),
        "not released by us"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_exposes_leadership_and_releases_the_lease_on_drain() {
    let sim = KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig)
        .expect("kubeconfig written");
    let args = CommonArgs {
        kubeconfig: Some(kubeconfig),
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
        holder(&sim, "svc-under-test").await.as_deref(),
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
        holder(&sim, "svc-under-test").await,
        None,
        "released on drain"
    );
    sim.shutdown().await;
}
