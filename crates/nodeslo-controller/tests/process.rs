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

/// `--shards auto` without `--leader-elect`, or `--shard-node-labels` without `--shards auto`, is
/// refused before anything starts, naming the flags.
#[tokio::test]
async fn sharding_flags_that_cannot_run_are_refused_at_start() {
    let auto = ["--shards", "auto"];
    contract::refused_at_start(BIN, &auto, "--shards auto needs --leader-elect").await;
    let labels = ["--shard-node-labels"];
    contract::refused_at_start(BIN, &labels, "--shard-node-labels needs --shards auto").await;
}
