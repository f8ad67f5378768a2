//! The built `machineset-controller` binary keeps the process contract of every Capstan binary.

use capstan_testkit::process::contract;
use capstan_testkit_sim::SimCluster;

const BIN: &str = env!("CARGO_BIN_EXE_machineset-controller");

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    let cluster = SimCluster::start().await;
    contract::serves_admin_endpoints_and_exits_zero_on_sigterm(
        BIN,
        &["--kubeconfig", cluster.kubeconfig_path()],
        "machineset-controller",
    )
    .await;
}

#[tokio::test]
async fn reads_flags_from_the_environment_and_logs_json() {
    let cluster = SimCluster::start().await;
    let envs = [("KUBECONFIG", cluster.kubeconfig_path())];
    contract::reads_flags_from_the_environment_and_logs_json(
        BIN,
        &[],
        &envs,
        "machineset-controller",
    )
    .await;
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_without_serving() {
    contract::bad_configuration_exits_non_zero_without_serving(BIN, &[]).await;
}
