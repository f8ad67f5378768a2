//! Helpers shared by the integration tests: a started server, raw HTTP, kubectl.
#![allow(dead_code)]

pub mod kubectl;

use kube_sim::{Config, KubeSim};
use serde_json::Value;
use std::io::{Read, Write};

pub async fn start() -> KubeSim {
    KubeSim::start(Config::default())
        .await
        .expect("kube-sim starts")
}

pub async fn start_with(config: Config) -> KubeSim {
    KubeSim::start(config).await.expect("kube-sim starts")
}

/// A server simulating workloads whose pods get IPs from `pod_cidr` (one range per test: tests
/// run in parallel and pods of a test binary listen on fixed ports of their own IPs).
pub async fn start_simulating(
    pod_cidr: &str,
    kubelet: kube_sim::kubelet::KubeletConfig,
) -> KubeSim {
    start_with(Config {
        simulate_workloads: true,
        workloads: kube_sim::workloads::WorkloadOptions {
            pod_cidr: pod_cidr.into(),
            ..Default::default()
        },
        kubelet,
        ..Default::default()
    })
    .await
}

/// A raw HTTP/1.0 exchange (the body is read until the server closes), so tests see exactly
/// the status and body the server writes. Returns (status, body).
pub async fn raw(
    sim: &KubeSim,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, String) {
    let addr = sim.addr();
    let (method, path, content_type, body) = (
        method.to_string(),
        path.to_string(),
        content_type.to_string(),
        body.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
        let req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, body.to_string())
    })
    .await
    .expect("raw request task")
}

pub async fn raw_json(
    sim: &KubeSim,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    let (code, body) = raw(sim, method, path, content_type, body).await;
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// POSTs a JSON body (an object to create, a fault rule); the status code and the JSON answer.
pub async fn post_json(sim: &KubeSim, path: &str, body: &str) -> (u16, Value) {
    raw_json(sim, "POST", path, "application/json", body).await
}

/// Counts stored objects at a collection URL.
pub async fn count(sim: &KubeSim, path: &str) -> usize {
    let (_, list) = raw_json(sim, "GET", path, "application/json", "").await;
    list["items"].as_array().map_or(0, Vec::len)
}

/// Runs `tests/python/<script>` with a kubeconfig for `sim` as its argument; panics with its
/// output when it fails.
pub async fn run_python(sim: &KubeSim, script: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&kubeconfig)
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python client test {} failed:\n{}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
