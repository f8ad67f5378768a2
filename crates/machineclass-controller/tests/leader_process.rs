//! The built binary with `--leader-elect` against kube-sim: it takes the Lease, releases it on
//! SIGTERM (exit 0), and exits non-zero by itself when the Lease is taken away.

use std::time::Duration;

use capstan_testkit::process::{BinaryUnderTest, http_get};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_sim::{Config, KubeSim};

const BIN: &str = env!("CARGO_BIN_EXE_machineclass-controller");
const WAIT: Duration = Duration::from_secs(20);

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .expect("get lease")
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.holder_identity)
}

async fn spawn_elected(sim: &KubeSim, dir: &tempfile::TempDir) -> BinaryUnderTest {
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig)
        .expect("kubeconfig written");
    let kubeconfig = kubeconfig.to_str().expect("utf-8 path").to_owned();
    BinaryUnderTest::spawn(
        BIN,
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--kubeconfig",
            &kubeconfig,
            "--leader-elect",
            "--lease-duration-seconds",
            "3",
            "--lease-grace-seconds",
            "1",
            "--lease-identity",
            "pod-a",
        ],
    )
    .await
    .expect("starts")
}

async fn wait_for_holder(leases: &Api<Lease>, want: Option<&str>) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if holder(leases, "machineclass-controller").await.as_deref() == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "holder never became {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_the_lease_and_releases_it_on_sigterm() {
    let sim = KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let leases: Api<Lease> = Api::namespaced(sim.client().expect("client"), "default");
    let mut bin = spawn_elected(&sim, &dir).await;

    wait_for_holder(&leases, Some("pod-a")).await;
    let metrics = http_get(bin.admin_addr(), "/metrics")
        .await
        .expect("metrics")
        .body;
    assert!(metrics.contains("capstan_leader"), "{metrics}");

    bin.sigterm().expect("signal delivered");
    let status = bin.wait_exit(WAIT).await.expect("exits");
    assert_eq!(status.code(), Some(0), "{}", bin.output().join("\n"));
    assert_eq!(
        holder(&leases, "machineclass-controller").await,
        None,
        "released"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_non_zero_when_the_lease_is_taken_away() {
    let sim = KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let leases: Api<Lease> = Api::namespaced(sim.client().expect("client"), "default");
    let mut bin = spawn_elected(&sim, &dir).await;
    wait_for_holder(&leases, Some("pod-a")).await;

    let takeover = serde_json::json!({
        "spec": {
            "holderIdentity": "intruder",
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
            "leaseDurationSeconds": 30,
        }
    });
    leases
        .patch(
            "machineclass-controller",
            &PatchParams::default(),
            &Patch::Merge(&takeover),
        )
        .await
        .expect("takeover patch");

    let status = bin.wait_exit(WAIT).await.expect("exits by itself");
    let output = bin.output().join("\n");
    assert!(!status.success(), "fail-stop exits non-zero: {output}");
    assert!(output.contains("leadership lost"), "{output}");
    assert_eq!(
        holder(&leases, "machineclass-controller").await.as_deref(),
        Some("intruder"),
        "the new holder keeps it"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_dead_trace_collector_does_not_block_the_drain() {
    // The controller needs a cluster to start; kube-sim stands in.
    let sim = KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig)
        .expect("kubeconfig written");
    let kubeconfig = kubeconfig.to_str().expect("utf-8 path").to_owned();
    let mut bin = BinaryUnderTest::spawn(
        BIN,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--metrics-addr",
            "127.0.0.1:0",
            "--otlp-endpoint",
            "http://127.0.0.1:9",
        ],
    )
    .await
    .expect("starts with an OTLP endpoint");
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
