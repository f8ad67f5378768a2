//! The built `machineclass-controller` binary keeps the process contract of every Capstan binary.

mod common;

use capstan_testkit::process::contract;

use common::BIN;

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    let env = common::Env::start().await;
    let kubeconfig = env.kubeconfig_path();
    contract::serves_admin_endpoints_and_exits_zero_on_sigterm(
        BIN,
        &["--kubeconfig", kubeconfig],
        "machineclass-controller",
    )
    .await;
}

#[tokio::test]
async fn reads_flags_from_the_environment_and_logs_json() {
    let env = common::Env::start().await;
    let kubeconfig = env.kubeconfig_path();
    let envs = [("KUBECONFIG", kubeconfig)];
    contract::reads_flags_from_the_environment_and_logs_json(
        BIN,
        &[],
        &envs,
        "machineclass-controller",
    )
    .await;
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_without_serving() {
    contract::bad_configuration_exits_non_zero_without_serving(BIN, &[]).await;
}

/// `--shards auto` without `--leader-elect` is refused before anything starts, naming both.
#[tokio::test]
async fn sharding_without_leader_election_is_refused_at_start() {
    let auto = ["--shards", "auto"];
    contract::refused_at_start(BIN, &auto, "--shards auto needs --leader-elect").await;
}
