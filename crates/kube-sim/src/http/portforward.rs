//! `pods/portforward`, proxied to the pod IP, in the three forms kube-apiserver serves: SPDY/3.1
//! stream pairs (`streamType: error|data`, `port`, `requestID` headers) over a plain
//! `Upgrade: SPDY/3.1` or tunneled in WebSocket binary messages (`SPDY/3.1+portforward.k8s.io`,
//! kubectl 1.32's first try), and the `v4.channel.k8s.io` channel pairs the Python client uses.

use super::Query;
use super::exec::{frame, normal_close};
use super::spdy::{self, FLAG_FIN, Frame, HeaderCodec};
use crate::error::ApiError;
use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::extract::Request;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, StatusCode, header};
use serde_json::Value;
use std::collections::HashMap;
use std::net::IpAddr;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// The SPDY sub-protocol both the upgrade and the tunnel negotiate.
const PORT_FORWARD_V1: &str = "portforward.k8s.io";
const TUNNEL_PREFIX: &str = "SPDY/3.1+";
const WEBSOCKET_PROTOCOLS: [&str; 3] = [
    "SPDY/3.1+portforward.k8s.io",
    "v4.channel.k8s.io",
    "channel.k8s.io",
];

/// Where a forwarded connection goes, and how errors name the pod (as kubelet's messages do).
#[derive(Clone)]
struct PodTarget {
    ip: IpAddr,
    name: String,
    uid: String,
}

impl PodTarget {
    async fn connect(&self, port: Result<u16, String>) -> Result<TcpStream, String> {
        let port = port?;
        TcpStream::connect((self.ip, port)).await.map_err(|e| {
            format!(
                "error forwarding port {port} to pod {}, uid {}: failed to connect to {}:{port}: {e}",
                self.name, self.uid, self.ip
            )
        })
    }
}

fn pod_target(pod: &Value) -> Result<PodTarget, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let ip = pod["status"]["podIP"]
        .as_str()
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!("pod {name} does not have a host assigned"))
        })?;
    Ok(PodTarget {
        ip,
        name: name.to_string(),
        uid: pod["metadata"]["uid"].as_str().unwrap_or_default().into(),
    })
}

fn parse_port(s: &str) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("invalid port {s:?}: must be an integer in 1-65535")),
    }
}

fn upgrade_header(headers: &HeaderMap) -> String {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Answers a port-forward request (an upgrade to SPDY or to one of [`WEBSOCKET_PROTOCOLS`]).
pub(super) async fn serve(pod: &Value, query: &Query, req: Request) -> Result<Response, ApiError> {
    let target = pod_target(pod)?;
    let upgrade = upgrade_header(req.headers());
    if upgrade.contains("spdy/3.1") {
        return spdy_upgrade(target, req);
    }
    if upgrade != "websocket" {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    let (mut parts, _) = req.into_parts();
    let ws = WebSocketUpgrade::from_request_parts(&mut parts, &())
        .await
        .map_err(|e| ApiError::bad_request(format!("unable to upgrade: {e}")))?
        .protocols(WEBSOCKET_PROTOCOLS);
    let Some(protocol) = ws
        .selected_protocol()
        .and_then(|p| p.to_str().ok())
        .map(str::to_string)
    else {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade: none of the requested subprotocols is supported: {}",
            WEBSOCKET_PROTOCOLS.join(", ")
        )));
    };
    if protocol.starts_with(TUNNEL_PREFIX) {
        return Ok(ws.on_upgrade(move |socket| tunnel(socket, target)));
    }
    let mut ports = Vec::new();
    for value in query.all("ports") {
        for p in value.split(',') {
            ports.push(parse_port(p).map_err(ApiError::bad_request)?);
        }
    }
    if ports.is_empty() {
        return Err(ApiError::bad_request(
            "query parameter \"ports\" is required",
        ));
    }
    Ok(ws.on_upgrade(move |socket| channels(socket, target, ports)))
}

/// The plain SPDY/3.1 upgrade (kubectl's fallback, and older clients' only way).
fn spdy_upgrade(target: PodTarget, mut req: Request) -> Result<Response, ApiError> {
    let offered = req
        .headers()
        .get_all("X-Stream-Protocol-Version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == PORT_FORWARD_V1);
    if !offered {
        return Err(ApiError::new(
            403,
            "Forbidden",
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports none of [{PORT_FORWARD_V1}]"
            ),
        ));
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            spdy_session(hyper_util::rt::TokioIo::new(upgraded), target).await;
        }
    });
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    h.insert(header::UPGRADE, http::HeaderValue::from_static("SPDY/3.1"));
    h.insert(
        "X-Stream-Protocol-Version",
        http::HeaderValue::from_static(PORT_FORWARD_V1),
    );
    Ok(r)
}

/// SPDY inside WebSocket: binary messages carry the SPDY byte stream, split anywhere.
async fn tunnel(socket: WebSocket, target: PodTarget) {
    let (session_io, tunnel_io) = tokio::io::duplex(64 * 1024);
    let (mut from_session, mut to_session) = tokio::io::split(tunnel_io);
    let (mut ws_tx, mut ws_rx) = socket.split();
    let inbound = async move {
        while let Some(Ok(msg)) = ws_rx.next().await {
            match msg {
                Message::Binary(b) if to_session.write_all(&b).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = to_session.shutdown().await;
    };
    let outbound = async move {
        let mut buf = vec![0u8; spdy::DATA_CHUNK + 64];
        loop {
            match from_session.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let msg = Message::Binary(Bytes::copy_from_slice(&buf[..n]));
                    if ws_tx.send(msg).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = ws_tx.send(normal_close()).await;
    };
    tokio::join!(inbound, outbound, spdy_session(session_io, target));
}

/// One port's pair of streams, as kubelet pairs them by `requestID`.
#[derive(Default)]
struct Pair {
    error: Option<u32>,
    data: Option<(u32, mpsc::Receiver<Bytes>)>,
    port: Option<Result<u16, String>>,
}

/// Serves SPDY port-forward stream pairs on a connection until the client goes away.
async fn spdy_session<S>(io: S, target: PodTarget)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(io);
    let (out, frames) = mpsc::channel::<Frame>(64);
    let writer = tokio::spawn(spdy::write_frames(wr, frames));
    let mut codec = HeaderCodec::default();
    // Client-to-pod bytes of each open data stream.
    let mut to_pod: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut forwards = JoinSet::new();
    loop {
        let frame = match spdy::read_frame(&mut rd, &mut codec).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, kind = e.metric_label(), "port-forward session ends");
                break;
            }
        };
        match frame {
            Frame::SynStream {
                stream,
                flags,
                headers,
            } => {
                let kind = spdy::header(&headers, "streamtype").unwrap_or_default();
                // Clients before requestID get kubelet's fallback: the error stream's id, and the
                // data stream's id less 2.
                let request_id = match spdy::header(&headers, "requestid") {
                    Some(id) => id.to_string(),
                    None if kind == "data" => stream.saturating_sub(2).to_string(),
                    None => stream.to_string(),
                };
                let port = match spdy::header(&headers, "port") {
                    Some(p) => parse_port(p),
                    None => Err("\"port\" header is required".to_string()),
                };
                if kind != "error" && kind != "data" {
                    let _ = out
                        .send(Frame::RstStream {
                            stream,
                            status: spdy::REFUSED_STREAM,
                        })
                        .await;
                    continue;
                }
                let _ = out
                    .send(Frame::SynReply {
                        stream,
                        flags: 0,
                        headers: Vec::new(),
                    })
                    .await;
                let pair = pairs.entry(request_id.clone()).or_default();
                pair.port.get_or_insert(port);
                if kind == "error" {
                    pair.error = Some(stream);
                } else {
                    let (tx, rx) = mpsc::channel(16);
                    if flags & FLAG_FIN == 0 {
                        to_pod.insert(stream, tx);
                    }
                    pair.data = Some((stream, rx));
                }
                if pair.error.is_some() && pair.data.is_some() {
                    let Some(Pair {
                        error: Some(error),
                        data: Some((data, rx)),
                        port: Some(port),
                    }) = pairs.remove(&request_id)
                    else {
                        continue;
                    };
                    let (target, out) = (target.clone(), out.clone());
                    forwards.spawn(forward(target, port, error, data, rx, out));
                }
            }
            Frame::Data {
                stream,
                flags,
                data,
            } => {
                if let Some(tx) = to_pod.get(&stream)
                    && !data.is_empty()
                    && tx.send(Bytes::from(data)).await.is_err()
                {
                    to_pod.remove(&stream);
                }
                if flags & FLAG_FIN != 0 {
                    to_pod.remove(&stream);
                }
            }
            Frame::RstStream { stream, .. } => {
                to_pod.remove(&stream);
            }
            Frame::Ping(id) => {
                let _ = out.send(Frame::Ping(id)).await;
            }
            Frame::GoAway { .. } => break,
            _ => {}
        }
    }
    forwards.abort_all();
    drop(out);
    let _ = writer.await;
}

/// Proxies one stream pair to the pod. The data stream ends (FIN) when the pod closes its side,
/// then the error stream, which is what tells kubectl the connection is done.
async fn forward(
    target: PodTarget,
    port: Result<u16, String>,
    error: u32,
    data: u32,
    mut from_client: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Frame>,
) {
    let fin = |stream| Frame::Data {
        stream,
        flags: FLAG_FIN,
        data: Vec::new(),
    };
    let conn = match target.connect(port).await {
        Ok(c) => c,
        Err(message) => {
            let _ = out
                .send(Frame::Data {
                    stream: error,
                    flags: 0,
                    data: message.into_bytes(),
                })
                .await;
            let _ = out.send(fin(error)).await;
            let _ = out.send(fin(data)).await;
            return;
        }
    };
    let (mut from_pod, mut to_pod) = conn.into_split();
    let up = async move {
        while let Some(b) = from_client.recv().await {
            if to_pod.write_all(&b).await.is_err() {
                break;
            }
        }
        let _ = to_pod.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; spdy::DATA_CHUNK];
        loop {
            match from_pod.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let frame = Frame::Data {
                        stream: data,
                        flags: 0,
                        data: buf[..n].to_vec(),
                    };
                    if out.send(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = out.send(fin(data)).await;
        let _ = out.send(fin(error)).await;
    };
    tokio::join!(up, down);
}

/// The v4 channel protocol: for the i-th port, channel 2i carries data and 2i+1 errors; the
/// first message on each channel is the port, little-endian.
async fn channels(socket: WebSocket, target: PodTarget, ports: Vec<u16>) {
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (out, mut outgoing) = mpsc::channel::<Message>(64);
    let mut readers = JoinSet::new();
    let mut writers = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let (data_channel, error_channel) = ((2 * i) as u8, (2 * i + 1) as u8);
        for channel in [data_channel, error_channel] {
            let _ = out.send(frame(channel, &port.to_le_bytes())).await;
        }
        match target.connect(Ok(*port)).await {
            Ok(conn) => {
                let (mut from_pod, to_pod) = conn.into_split();
                writers.push(Some(to_pod));
                let out = out.clone();
                readers.spawn(async move {
                    let mut buf = vec![0u8; spdy::DATA_CHUNK];
                    loop {
                        match from_pod.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if out.send(frame(data_channel, &buf[..n])).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                });
            }
            Err(message) => {
                let _ = out.send(frame(error_channel, message.as_bytes())).await;
                writers.push(None);
            }
        }
    }
    // The connection ends once every port's pod side has ended.
    drop(out);
    loop {
        tokio::select! {
            msg = outgoing.recv() => match msg {
                Some(m) => if ws_tx.send(m).await.is_err() { break },
                None => { let _ = ws_tx.send(normal_close()).await; break }
            },
            msg = ws_rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let Some((&channel, payload)) = b.split_first() else { continue };
                    let index = usize::from(channel / 2);
                    if channel % 2 == 0
                        && let Some(Some(w)) = writers.get_mut(index)
                        && w.write_all(payload).await.is_err()
                    {
                        writers[index] = None;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    readers.abort_all();
}
