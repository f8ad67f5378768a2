//! The `kube-sim serve` binary: writes its kubeconfig once ready, prints one line naming it,
//! serves, and exits 0 on SIGTERM. Also: instances side by side do not share state.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn serve_writes_a_kubeconfig_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["serve", "--addr", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kube-sim starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("one line");
    assert!(line.contains(&kubeconfig.display().to_string()), "{line}");
    let config = std::fs::read_to_string(&kubeconfig).expect("kubeconfig written before the line");
    let server = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("server in kubeconfig")
        .to_string();
    let addr = server.trim_start_matches("http://");
    let get = |path: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("serving");
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .expect("request");
        let mut resp = String::new();
        s.read_to_string(&mut resp).expect("response");
        resp
    };
    for probe in ["/readyz", "/livez"] {
        let resp = get(probe);
        assert!(
            resp.starts_with("HTTP/1.0 200") && resp.ends_with("ok"),
            "{probe}: {resp}"
        );
    }
    // Like kube-apiserver, its own /metrics counts the requests it served.
    let metrics = get("/metrics");
    assert!(metrics.starts_with("HTTP/1.0 200"), "{metrics}");
    assert!(metrics.contains("apiserver_request_total"), "{metrics}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "exit status {status:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kube-sim did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn instances_side_by_side_do_not_share_state() {
    let a = common::start().await;
    let b = common::start().await;
    assert_ne!(a.url(), b.url());
    let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"only-in-a"}}"#;
    let (code, _) = common::raw_json(
        &a,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        cm,
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(
        common::count(&a, "/api/v1/namespaces/default/configmaps").await,
        1
    );
    assert_eq!(
        common::count(&b, "/api/v1/namespaces/default/configmaps").await,
        0
    );
    let kubeconfig = a.kubeconfig();
    assert_eq!(
        kubeconfig.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone()),
        Some(a.url())
    );
    a.shutdown().await;
    // The other instance keeps serving.
    assert_eq!(
        common::count(&b, "/api/v1/namespaces/default/configmaps").await,
        0
    );
    let (code, _) = common::raw_json(&b, "GET", "/version", "", "").await;
    assert_eq!(code, 200);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_https_with_a_generated_ca() {
    let sim = common::start_with(kube_sim::Config {
        tls: true,
        ..Default::default()
    })
    .await;
    assert!(sim.url().starts_with("https://127.0.0.1:"));
    assert!(
        sim.ca_pem()
            .is_some_and(|p| p.starts_with("-----BEGIN CERTIFICATE-----"))
    );
    assert!(
        sim.kubeconfig_yaml()
            .contains("certificate-authority-data: ")
    );
    // kube-rs verifies the server against the CA it is given.
    let client = sim.client().expect("client");
    let version = client.apiserver_version().await.expect("version over TLS");
    assert_eq!(version.minor, "33");
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::default_namespaced(client);
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "secure"}})).expect("valid");
    cms.create(&kube::api::PostParams::default(), &cm)
        .await
        .expect("create over TLS");
    // So does kubectl, from the written kubeconfig.
    if capstan_testkit::require(
        "kubectl (for its kubectl part)",
        capstan_testkit::on_path("kubectl"),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let out = tokio::process::Command::new("kubectl")
            .env("KUBECONFIG", &kubeconfig)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .args(["get", "configmap", "secure", "-o", "name"])
            .output()
            .await
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "configmap/secure"
        );
    }
    // Plain HTTP is not answered on the TLS port.
    let (code, _) = common::raw(&sim, "GET", "/version", "", "").await;
    assert_ne!(code, 200);
    sim.shutdown().await;
}
