//! The built `nodeslo-controller` binary keeps the process contract of every Capstan binary.

use capstan_testkit::process::contract;

mod common;
use common::{BIN, Cluster};

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    let cluster = Cluster::start().await;
    let args = ["--kubeconfig", cluster.kubeconfig_path()];
    contract::serves_admin_endpoints_and_exits_zero_on_sigterm(BIN, &args, "nodeslo-controller")
        .await;
}

#[tokio::test]
async fn reads_flags_from_the_environment_and_logs_json() {
    let cluster = Cluster::start().await;
    let envs = [("KUBECONFIG", cluster.kubeconfig_path())];
    contract::reads_flags_from_the_environment_and_logs_json(BIN, &[], &envs, "nodeslo-controller")
        .await;
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_without_serving() {
    contract::bad_configuration_exits_non_zero_without_serving(BIN, &[]).await;
}
