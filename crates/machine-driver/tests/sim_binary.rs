//! The `machine-driver-sim` binary: serves the simulated provider over gRPC for a kubeconfig.

mod common;

use std::process::Stdio;
use std::time::Duration;

use capstan_apis::machine::Code;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use machine_driver::Driver;
use machine_driver::grpc::GrpcDriver;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use common::{request, sim};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_simulator_over_grpc() {
    let (sim, client) = sim().await;
    let dir = std::env::temp_dir().join(format!("machine-driver-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_machine-driver-sim"))
        .args(["--listen", "127.0.0.1:0", "--sim-ready-delay", "0s"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawned");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if let Some(addr) = line.strip_prefix("driver listening on ") {
                return addr.to_owned();
            }
        }
        panic!("exited without listening");
    })
    .await
    .expect("listening line");

    let driver = GrpcDriver::connect_lazy(&format!("http://{addr}")).expect("client");
    let request = request("m-1", json!({}));
    let info = driver
        .create_machine(&request)
        .await
        .expect("created over gRPC");
    assert_eq!(info.node_name, "m-1");
    let nodes: Api<Node> = Api::all(client);
    assert!(
        nodes.get_opt("m-1").await.expect("get").is_some(),
        "node registered by the server process"
    );
    driver.delete_machine(&request).await.expect("deleted");
    assert_eq!(
        driver
            .get_machine_status(&request)
            .await
            .expect_err("gone")
            .code,
        Code::NotFound
    );
    child.kill().await.expect("killed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_flags_stop_start_up_naming_what_is_wrong() {
    let bin = env!("CARGO_BIN_EXE_machine-driver-sim");
    // The common flags, as every Capstan binary checks them.
    capstan_testkit::process::contract::bad_configuration_exits_non_zero_without_serving(
        bin,
        &["--listen", "127.0.0.1:0"],
    )
    .await;
    // Its own: the Ready delay is a Go duration, as the controller's `--sim-ready-delay`.
    for (value, says) in [("2", "2"), ("-1s", "-1s"), ("soon", "soon")] {
        let out = tokio::process::Command::new(bin)
            .args(["--listen", "127.0.0.1:0"])
            .arg(format!("--sim-ready-delay={value}"))
            .output()
            .await
            .expect("ran");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("--sim-ready-delay") && stderr.contains(says),
            "names the flag and the value: {stderr}"
        );
    }
}
