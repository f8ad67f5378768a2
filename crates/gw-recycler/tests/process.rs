//! The built `gw-recycler` binary keeps the process contract of every Capstan binary.

use capstan_testkit::process::contract;

const BIN: &str = env!("CARGO_BIN_EXE_gw-recycler");

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    contract::serves_admin_endpoints_and_exits_zero_on_sigterm(
        BIN,
        &["--role", "server"],
        "gw-recycler",
    )
    .await;
}

#[tokio::test]
async fn reads_flags_from_the_environment_and_logs_json() {
    contract::reads_flags_from_the_environment_and_logs_json(
        BIN,
        &["--role", "client"],
        &[],
        "gw-recycler",
    )
    .await;
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_without_serving() {
    contract::bad_configuration_exits_non_zero_without_serving(BIN, &["--role", "server"]).await;
}
