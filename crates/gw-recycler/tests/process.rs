//! The built `gw-recycler` binary keeps the process contract of every Capstan binary.

use capstan_testkit::process::contract;
use capstan_testkit_sim::SimCluster;

const BIN: &str = env!("CARGO_BIN_EXE_gw-recycler");
const HUB_NS: &str = "kubeslice-red";

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    // One kube-sim serves as hub and worker at once.
    let cluster = SimCluster::start().await;
    let path = cluster.kubeconfig_path();
    let args = [
        "--kubeconfig",
        path,
        "--hub-kubeconfig",
        path,
        "--hub-namespace",
        HUB_NS,
    ];
    contract::serves_admin_endpoints_and_exits_zero_on_sigterm(BIN, &args, "gw-recycler").await;
}

#[tokio::test]
async fn reads_flags_from_the_environment_and_logs_json() {
    // One kube-sim serves as hub and worker at once.
    let cluster = SimCluster::start().await;
    let path = cluster.kubeconfig_path();
    let envs = [
        ("KUBECONFIG", path),
        ("HUB_KUBECONFIG", path),
        ("HUB_NAMESPACE", HUB_NS),
        ("GW_RECYCLER_ROLE", "client"),
    ];
    contract::reads_flags_from_the_environment_and_logs_json(BIN, &[], &envs, "gw-recycler").await;
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_without_serving() {
    contract::bad_configuration_exits_non_zero_without_serving(BIN, &["--role", "server"]).await;
}

#[tokio::test]
async fn a_drain_delay_not_shorter_than_the_step_timeout_stops_start_up_naming_both() {
    let out = tokio::process::Command::new(BIN)
        .args(["--drain-delay", "5m", "--step-timeout", "5m"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .output()
        .await
        .expect("gw-recycler runs");
    // clap's usage-error exit code, before any connection is made.
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--drain-delay (300s) must be shorter than --step-timeout (300s)"),
        "{stderr}"
    );
}
