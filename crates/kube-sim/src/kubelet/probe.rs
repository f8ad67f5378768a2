//! Readiness probes as kubelet runs them: `httpGet` (a status from 200 to 399 passes, host
//! defaulting to the pod IP), `tcpSocket` (a connection passes) or `exec` (exit 0 passes), every
//! `periodSeconds` after `initialDelaySeconds`, with `successThreshold`/`failureThreshold`.

use super::process::ContainerRun;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A probe port: a number, or the name of one of the container's ports.
fn port(probe_port: &Value, ports: &Value) -> Option<u16> {
    if let Some(n) = probe_port.as_u64() {
        return u16::try_from(n).ok();
    }
    let name = probe_port.as_str()?;
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    ports.as_array()?.iter().find(|p| p["name"] == name)?["containerPort"]
        .as_u64()
        .and_then(|n| u16::try_from(n).ok())
}

async fn http_get(host: &str, port: u16, path: &str) -> std::io::Result<bool> {
    let mut s = tokio::net::TcpStream::connect((host, port)).await?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await?;
    let code: u16 = std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((200..400).contains(&code))
}

/// One probe attempt.
async fn attempt(c: &ContainerRun, probe: &Value) -> bool {
    let timeout = Duration::from_secs(probe["timeoutSeconds"].as_u64().unwrap_or(1).max(1));
    let run = async {
        if let Some(get) = probe.get("httpGet") {
            let host = get["host"].as_str().unwrap_or(&c.pod_ip).to_string();
            let Some(port) = port(&get["port"], &c.ports) else {
                return false;
            };
            let path = get["path"].as_str().unwrap_or("/");
            return http_get(&host, port, path).await.unwrap_or(false);
        }
        if let Some(tcp) = probe.get("tcpSocket") {
            let host = tcp["host"].as_str().unwrap_or(&c.pod_ip).to_string();
            let Some(port) = port(&tcp["port"], &c.ports) else {
                return false;
            };
            return tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .is_ok();
        }
        if let Some(exec) = probe.get("exec") {
            let argv: Vec<&str> = exec["command"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let Some((program, args)) = argv.split_first() else {
                return false;
            };
            return tokio::process::Command::new(program)
                .args(args)
                .env_clear()
                .envs(c.env.iter().map(|(k, v)| (k, v)))
                .current_dir(&c.workdir)
                .kill_on_drop(true)
                .status()
                .await
                .is_ok_and(|s| s.success());
        }
        false
    };
    tokio::time::timeout(timeout, run).await.unwrap_or(false)
}

/// Probes one container instance until `stop`, publishing readiness changes.
pub(super) async fn readiness(c: Arc<ContainerRun>, stop: CancellationToken, changed: Arc<Notify>) {
    let probe = c.readiness.clone();
    let secs = |k: &str, default: u64| probe[k].as_u64().unwrap_or(default);
    let period = Duration::from_secs(secs("periodSeconds", 10).max(1));
    let (success_needed, failure_needed) = (
        secs("successThreshold", 1).max(1),
        secs("failureThreshold", 3).max(1),
    );
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(secs("initialDelaySeconds", 0))) => {}
        _ = stop.cancelled() => return,
    }
    let (mut successes, mut failures) = (0, 0);
    loop {
        if attempt(&c, &probe).await {
            successes += 1;
            failures = 0;
            if successes >= success_needed && c.set_ready(true) {
                changed.notify_one();
            }
        } else {
            failures += 1;
            successes = 0;
            if failures >= failure_needed && c.set_ready(false) {
                changed.notify_one();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn probe_ports_are_numbers_or_named_container_ports() {
        let ports = json!([{"name": "http", "containerPort": 8080}]);
        assert_eq!(port(&json!(9000), &ports), Some(9000));
        assert_eq!(port(&json!("http"), &ports), Some(8080));
        assert_eq!(port(&json!("8081"), &ports), Some(8081));
        assert_eq!(port(&json!("grpc"), &ports), None);
        assert_eq!(port(&json!(70000), &ports), None);
    }
}
