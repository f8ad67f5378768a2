//! The built `gw-recycler` binary keeps the process contract of every Capstan binary.

use capstan_runtime::testing::contract;

mod common;
use common::{BIN, Cluster, HUB_NS};

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    let cluster = Cluster::start("127.40.0.0/16", HUB_NS).await;
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
    let cluster = Cluster::start("127.41.0.0/16", HUB_NS).await;
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
