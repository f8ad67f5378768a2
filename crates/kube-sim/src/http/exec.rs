//! `pods/exec` and `pods/attach` over WebSocket, as kube-apiserver serves them to kubectl 1.32 and
//! the client libraries: the `v5.channel.k8s.io` / `v4.channel.k8s.io` protocols, where every
//! binary message starts with its channel (0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize; v5
//! adds 255 "close this stream"), and channel 3 carries the final `Status` (exit code included).

use super::Query;
use super::stream::container_name;
use crate::error::ApiError;
use crate::kubelet::Kubelet;
use crate::kubelet::expand::container_env;
use crate::kubelet::logs::{self, LogRequest};
use axum::extract::FromRequestParts;
use axum::extract::Request;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Stdio;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

/// The final status message of a command, as kubelet's remotecommand writes it.
pub fn exit_status(command: &[String], code: i64) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({"metadata": {}, "status": "Failure",
           "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", command.join(" ")),
           "reason": "NonZeroExitCode",
           "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
}

/// Where and with what a command runs: the container's environment and working directory.
struct Target {
    env: Vec<(String, String)>,
    workdir: PathBuf,
}

fn target(kubelet: &Kubelet, pod: &Value, container: &str) -> Result<Target, ApiError> {
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    if let Some(run) = kubelet
        .pod(uid)
        .and_then(|r| r.container(Some(container)))
        .filter(|c| c.is_process())
    {
        if !run.running() {
            return Err(ApiError::bad_request(format!(
                "unable to upgrade connection: container not found (\"{container}\")"
            )));
        }
        return Ok(Target {
            env: run.env.clone(),
            workdir: run.workdir.clone(),
        });
    }
    if kubelet.exec_host_commands() {
        let spec = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == container)
            .cloned()
            .unwrap_or(Value::Null);
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
        let mut env = vec![(
            "PATH".to_string(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        )];
        env.extend(container_env(pod, &spec, ip));
        return Ok(Target {
            env,
            workdir: std::env::temp_dir(),
        });
    }
    // No kubelet answers for this pod: kube-apiserver's error when it cannot reach one.
    let host = pod["status"]["hostIP"].as_str().unwrap_or("127.0.0.1");
    Err(ApiError::new(
        500,
        "InternalError",
        format!("error dialing backend: dial tcp {host}:10250: connect: connection refused"),
    ))
}

/// Answers an exec or attach request (an upgrade to one of [`PROTOCOLS`]).
pub(super) async fn serve(
    kubelet: &Kubelet,
    pod: &Value,
    sub: &str,
    query: &Query,
    req: Request,
) -> Result<Response, ApiError> {
    let container = container_name(pod, query)?;
    let command = query.all("command");
    if sub == "exec" && command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let stdin = query.flag("stdin");
    // Whether a kubelet answers is known before the upgrade, so the SPDY fallback (a POST)
    // gets the same error as the WebSocket request.
    let target = match sub {
        "exec" => Some(target(kubelet, pod, &container)?),
        _ => None,
    };
    let (mut parts, _) = req.into_parts();
    let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|_| ApiError::bad_request("Upgrade request required"))?;
    let upgrade = upgrade.protocols(PROTOCOLS);
    if upgrade.selected_protocol().is_none() {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade: none of the requested subprotocols is supported: {}",
            PROTOCOLS.join(", ")
        )));
    }
    if sub == "attach" {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let run = kubelet
            .pod(uid)
            .and_then(|r| r.container(Some(&container)))
            .filter(|c| c.is_process() && c.running())
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unable to upgrade connection: container not found (\"{container}\")"
                ))
            })?;
        let (instance, _) = run.instance();
        let follow = LogRequest {
            follow: true,
            tail_lines: Some(0),
            ..Default::default()
        };
        let output = logs::open(run, instance, &follow)
            .await
            .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))?;
        return Ok(upgrade.on_upgrade(move |socket| attach(socket, output)));
    }
    let Some(target) = target else {
        return Err(ApiError::resource_not_found());
    };
    Ok(upgrade.on_upgrade(move |socket| run_command(socket, command, target, stdin)))
}

/// A normal closure (1000): client-go reports any other close, even one without a code, as an error.
pub(super) fn normal_close() -> Message {
    Message::Close(Some(axum::extract::ws::CloseFrame {
        code: axum::extract::ws::close_code::NORMAL,
        reason: "".into(),
    }))
}

pub(super) fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::Binary(Bytes::from(v))
}

async fn attach(
    socket: WebSocket,
    mut output: futures::stream::BoxStream<'static, std::io::Result<Bytes>>,
) {
    let (mut tx, mut rx) = socket.split();
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(b)) if b.is_empty() => {}
                Some(Ok(b)) => if tx.send(frame(STDOUT, &b)).await.is_err() { return },
                _ => break,
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                _ => {}
            },
        }
    }
    let status = serde_json::to_vec(&exit_status(&[], 0)).unwrap_or_default();
    let _ = tx.send(frame(STATUS, &status)).await;
    let _ = tx.send(normal_close()).await;
}

async fn run_command(socket: WebSocket, command: Vec<String>, target: Target, stdin: bool) {
    let (mut tx, mut rx) = socket.split();
    let Some((program, args)) = command.split_first() else {
        return;
    };
    let spawned = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(target.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&target.workdir)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            // kubelet's message when the runtime cannot start the command.
            let status = json!({"metadata": {}, "status": "Failure",
                "message": format!("failed to exec in container: starting container process caused: exec: \"{program}\": {e}"),
                "reason": "InternalError", "code": 500});
            let _ = tx
                .send(frame(
                    STATUS,
                    &serde_json::to_vec(&status).unwrap_or_default(),
                ))
                .await;
            let _ = tx.send(normal_close()).await;
            return;
        }
    };
    let mut child_in = child.stdin.take();
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let (mut out_buf, mut err_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    let mut client_gone = false;
    while out.is_some() || err.is_some() {
        tokio::select! {
            n = read_some(&mut out, &mut out_buf) => match n {
                Some(n) => if tx.send(frame(STDOUT, &out_buf[..n])).await.is_err() { client_gone = true; break },
                None => out = None,
            },
            n = read_some(&mut err, &mut err_buf) => match n {
                Some(n) => if tx.send(frame(STDERR, &err_buf[..n])).await.is_err() { client_gone = true; break },
                None => err = None,
            },
            msg = rx.next() => {
                // The Python client sends str stdin as text frames; kube-apiserver reads both.
                let data = match msg {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Text(t))) => Bytes::copy_from_slice(t.as_bytes()),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => { client_gone = true; break }
                    Some(Ok(_)) => continue,
                };
                match data.first() {
                    Some(&STDIN) => if let Some(w) = child_in.as_mut()
                        && w.write_all(&data[1..]).await.is_err() {
                        child_in = None;
                    },
                    Some(&CLOSE) if data.get(1) == Some(&STDIN) => child_in = None,
                    _ => {}
                }
            }
        }
    }
    drop(child_in);
    if client_gone {
        let _ = child.start_kill();
        let _ = child.wait().await;
        return;
    }
    let code = match child.wait().await {
        Ok(s) => s.code().map(i64::from).unwrap_or(137),
        Err(_) => 1,
    };
    let status = serde_json::to_vec(&exit_status(&command, code)).unwrap_or_default();
    let _ = tx.send(frame(STATUS, &status)).await;
    let _ = tx.send(normal_close()).await;
}

/// Reads from an optional pipe; `None` at end of stream (or when there is no pipe).
async fn read_some<R: tokio::io::AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    match pipe {
        Some(p) => match p.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_carry_the_code_as_kubelet_writes_them() {
        assert_eq!(
            exit_status(&["true".into()], 0),
            json!({"metadata": {}, "status": "Success"})
        );
        let s = exit_status(&["sh".into(), "-c".into(), "exit 3".into()], 3);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(
            s["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );
        assert_eq!(
            s["message"],
            "command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3"
        );
    }
}
