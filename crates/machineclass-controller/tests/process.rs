//! The built `machineclass-controller` binary as a process: admin endpoints, JSON logs from env, SIGTERM drain.

use std::time::Duration;

mod common;

use capstan_runtime::testing::{BinaryUnderTest, TestingError, http_get};

use common::BIN;
const EXIT_WITHIN: Duration = Duration::from_secs(15);

async fn wait_ready(bin: &BinaryUnderTest) {
    for _ in 0..100 {
        if http_get(bin.admin_addr(), "/readyz")
            .await
            .is_ok_and(|r| r.status == 200)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never ready; output:\n{}", bin.output().join("\n"));
}

#[tokio::test]
async fn serves_admin_endpoints_and_exits_zero_on_sigterm() {
    let env = common::Env::start().await;
    let kubeconfig = env.kubeconfig_path();
    let mut bin = BinaryUnderTest::spawn(
        BIN,
        &["--kubeconfig", &kubeconfig, "--metrics-addr", "127.0.0.1:0"],
    )
    .await
    .expect("starts and logs its admin address");
    let addr = bin.admin_addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");

    let livez = http_get(addr, "/livez").await.expect("livez");
    assert_eq!((livez.status, livez.body.as_str()), (200, "ok"));
    wait_ready(&bin).await;
    let metrics = http_get(addr, "/metrics").await.expect("metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .contains(r#"capstan_build_info{service="machineclass-controller",version="#),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("capstan_leader 1\n"),
        "no election: leader; {}",
        metrics.body
    );
    assert!(metrics.body.ends_with("# EOF\n"), "{}", metrics.body);

    bin.sigterm().expect("signal delivered");
    let status = bin.wait_exit(EXIT_WITHIN).await.expect("exits");
    let output = bin.output().join("\n");
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains("shutdown requested"), "{output}");
    assert!(output.contains("admin server stopped"), "{output}");
}

#[tokio::test]
async fn reads_flags_from_the_environment_and_logs_json() {
    let env = common::Env::start().await;
    let kubeconfig = env.kubeconfig_path();
    let mut bin = BinaryUnderTest::spawn_with_env(
        BIN,
        &[],
        &[
            ("KUBECONFIG", kubeconfig.as_str()),
            ("METRICS_ADDR", "127.0.0.1:0"),
            ("LOG_FORMAT", "json"),
            ("LOG_LEVEL", "info"),
        ],
    )
    .await
    .expect("starts with env configuration");
    let addr_line = bin
        .output()
        .into_iter()
        .find(|line| line.contains("admin server listening on"))
        .expect("address line");
    let record: serde_json::Value = serde_json::from_str(&addr_line).expect("a JSON log record");
    assert_eq!(record["level"], "INFO", "{record}");
    assert_eq!(
        record["fields"]["service"], "machineclass-controller",
        "{record}"
    );

    bin.sigterm().expect("signal delivered");
    let status = bin.wait_exit(EXIT_WITHIN).await.expect("exits");
    assert!(status.success(), "{}", bin.output().join("\n"));
}

#[tokio::test]
async fn bad_configuration_exits_non_zero_without_serving() {
    let error = BinaryUnderTest::spawn(
        BIN,
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-level",
            "info,kube=loud",
        ],
    )
    .await
    .expect_err("an invalid log filter stops start-up");
    match error {
        TestingError::ExitedEarly { status, output } => {
            assert!(status.is_some_and(|s| !s.success()), "{output}");
            assert!(output.contains("invalid log level"), "{output}");
        }
        other => panic!("unexpected {other}"),
    }
}
