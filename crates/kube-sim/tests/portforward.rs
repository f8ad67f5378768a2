//! `pods/portforward` against a pod running the `kube-sim-testpod` binary (`--exec-images`):
//! kubectl 1.32 over its first choice (SPDY tunneled in WebSocket), over the plain SPDY/3.1
//! upgrade it falls back to, and the Python client's `portforward` (v4 channels). kubectl and
//! Python are called unconditionally.

mod common;

use common::kubectl::Kubectl;
use kube_sim::KubeSim;
use kube_sim::kubelet::KubeletConfig;
use serde_json::json;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

const IMAGE: &str = "capstan/testpod";

/// A server whose pods get IPs from `pod_cidr` (one per test: every pod listens on 8080).
async fn start(pod_cidr: &str) -> KubeSim {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_kube-sim-testpod"))
        .parent()
        .expect("binary directory")
        .to_path_buf();
    let kubelet = KubeletConfig {
        exec_images: vec![(IMAGE.into(), dir)],
        ..Default::default()
    };
    common::start_simulating(pod_cidr, kubelet).await
}

/// Creates pod `web` serving HTTP on 8080 and waits until it is Ready.
async fn web_pod(sim: &KubeSim) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": format!("{IMAGE}:v1"), "command": ["kube-sim-testpod"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1}}]}});
    let (code, body) = common::raw(
        sim,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        &pod.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    for _ in 0..300 {
        let (_, p) = common::raw_json(
            sim,
            "GET",
            "/api/v1/namespaces/default/pods/web",
            "application/json",
            "",
        )
        .await;
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        if ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pod web never became Ready");
}

/// An HTTP GET through a local port; the whole reply (the pod closes after it).
async fn get(port: u16, path: &str) -> String {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("local port");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let request = format!("GET {path} HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
    .await
    .expect("request task")
}

/// Runs `kubectl port-forward pod/web :8080` (with `env`), sends two requests through it (two
/// stream pairs on one connection) and returns kubectl's stderr.
async fn forward_twice(sim: &KubeSim, env: &[(&str, &str)]) -> String {
    let k = Kubectl::new(sim);
    let mut cmd = k.command(&["port-forward", "pod/web", ":8080", "-v=4"]);
    cmd.envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl port-forward");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    // "Forwarding from 127.0.0.1:PORT -> 8080"
    let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("kubectl starts forwarding")
        .expect("read")
        .expect("a line");
    let port: u16 = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line: {line}"));
    for path in ["/first", "/second"] {
        let reply = get(port, path).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.ends_with("hello from web"), "{reply}");
    }
    child.start_kill().expect("stop kubectl");
    let out = child.wait_with_output().await.expect("kubectl ends");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_over_spdy_tunneled_in_websocket() {
    let sim = start("127.11.5.0/24").await;
    web_pod(&sim).await;
    let stderr = forward_twice(&sim, &[]).await;
    // kubectl falls back to plain SPDY quietly when the WebSocket upgrade fails: its -v=4 log
    // says which one it got.
    assert!(
        stderr.contains("negotiated protocol: portforward.k8s.io") && !stderr.contains("fallback"),
        "{stderr}"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_over_the_plain_spdy_upgrade() {
    let sim = start("127.11.6.0/24").await;
    web_pod(&sim).await;
    let stderr = forward_twice(&sim, &[("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")]).await;
    assert!(!stderr.contains("WebSocket"), "{stderr}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_portforward_over_v4_channels() {
    let sim = start("127.11.7.0/24").await;
    web_pod(&sim).await;
    common::run_python(&sim, "portforward.py").await;
    sim.shutdown().await;
}
