//! The real binaries: start on port 0, answer gRPC, health and admin requests,
//! and exit 0 on SIGTERM.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use capstan_proto::router::slice_router_sidecar_service_client::SliceRouterSidecarServiceClient;
use capstan_proto::router::{SliceGwConContext, VerifyRouteAddRequest};
use capstan_proto::sidecar::TunnelStatusType;
use capstan_proto::sidecar::gw_sidecar_service_client::GwSidecarServiceClient;
use capstan_testkit::on_path;
use capstan_testkit::process::{BinaryUnderTest, http_get};
use common::set;
use sidecar_shim::server::GRPC_LISTENING_MARKER;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const ROUTER: &str = env!("CARGO_BIN_EXE_router-sidecar");
const GW: &str = env!("CARGO_BIN_EXE_gw-sidecar");

/// The gRPC address the binary logged (`grpc server listening on ADDR`).
async fn grpc_addr(bin: &BinaryUnderTest) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = bin.output().iter().find_map(|line| {
            let rest = &line[line.find(GRPC_LISTENING_MARKER)? + GRPC_LISTENING_MARKER.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
                .unwrap_or(rest.len());
            rest[..end].parse::<SocketAddr>().ok()
        });
        if let Some(addr) = found {
            // A wildcard listener is reached through loopback.
            return if addr.ip().is_unspecified() {
                SocketAddr::from(([127, 0, 0, 1], addr.port()))
            } else {
                addr
            };
        }
        assert!(
            Instant::now() < deadline,
            "no gRPC address logged:\n{}",
            bin.output().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn assert_serving(addr: SocketAddr, service: &str) {
    let mut health = HealthClient::new(common::channel(addr).await);
    let reply = health
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check")
        .into_inner();
    assert_eq!(reply.status, ServingStatus::Serving as i32);
}

async fn sigterm_exits_zero(mut bin: BinaryUnderTest) {
    bin.sigterm().expect("SIGTERM");
    let status = bin.wait_exit(Duration::from_secs(15)).await.expect("exits");
    assert!(
        status.success(),
        "exit status {status:?}; output:\n{}",
        bin.output().join("\n")
    );
}

fn context(hops: &[&str]) -> SliceGwConContext {
    SliceGwConContext {
        remote_slice_gw_nsm_subnet: "10.2.0.0/16".into(),
        local_nsm_gw_peer_ip_list: hops.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn router_sidecar_memory_binary() {
    let bin = BinaryUnderTest::spawn(
        ROUTER,
        &[
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--client-connection",
            "app-pod,nsm0,10.1.2.1,10.1.2.2",
        ],
    )
    .await
    .expect("router-sidecar starts");
    let addr = grpc_addr(&bin).await;
    let mut client = SliceRouterSidecarServiceClient::new(common::channel(addr).await);

    client
        .update_slice_gw_connection_context(context(&["10.1.1.2", "10.1.1.3"]))
        .await
        .expect("update");
    let present = client
        .get_route_in_kernel(VerifyRouteAddRequest {
            dst_ip: "10.2.0.0/16".into(),
            nsm_ip: "10.1.1.3".into(),
        })
        .await
        .expect("query")
        .into_inner();
    assert!(present.is_route_present);
    let invalid = client
        .get_route_in_kernel(VerifyRouteAddRequest::default())
        .await
        .expect_err("invalid");
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);
    let info = client
        .get_slice_router_client_connection_info(())
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.connection[0].pod_name, "app-pod");

    assert_serving(addr, "router.SliceRouterSidecarService").await;
    assert_eq!(
        http_get(bin.admin_addr(), "/readyz")
            .await
            .expect("readyz")
            .status,
        200
    );
    let metrics = http_get(bin.admin_addr(), "/metrics")
        .await
        .expect("metrics")
        .body;
    let ok_line = r#"grpc_server_handled_total{grpc_service="router.SliceRouterSidecarService",grpc_method="UpdateSliceGwConnectionContext",grpc_code="OK"} 1"#;
    assert!(metrics.contains(ok_line), "{metrics}");
    let invalid_line = r#"grpc_server_handled_total{grpc_service="router.SliceRouterSidecarService",grpc_method="GetRouteInKernel",grpc_code="InvalidArgument"} 1"#;
    assert!(metrics.contains(invalid_line), "{metrics}");
    assert!(
        metrics.contains("grpc_server_handling_seconds_bucket"),
        "{metrics}"
    );

    sigterm_exits_zero(bin).await;
}

#[tokio::test]
async fn router_sidecar_honours_grpc_port_env() {
    let bin = BinaryUnderTest::spawn_with_env(
        ROUTER,
        &["--backend", "memory", "--metrics-addr", "127.0.0.1:0"],
        &[("GRPC_PORT", "0")],
    )
    .await
    .expect("router-sidecar starts");
    let addr = grpc_addr(&bin).await;
    assert!(
        bin.output()
            .iter()
            .any(|line| line.contains(&format!("{GRPC_LISTENING_MARKER}0.0.0.0:"))),
        "GRPC_PORT binds all interfaces"
    );
    // Port 0 asks the kernel for a free port: neither 0 nor KubeSlice's default 5000, which an
    // ignored GRPC_PORT would bind.
    assert!(
        addr.port() != 0 && addr.port() != 5000,
        "GRPC_PORT=0 was not honoured: {addr}"
    );
    assert_serving(addr, "router.SliceRouterSidecarService").await;
    sigterm_exits_zero(bin).await;
}

#[tokio::test]
async fn router_sidecar_kernel_binary_in_a_namespace() {
    let Some(netns) = common::netns() else {
        return;
    };
    netns.veth("v0", "v1", Some("10.1.1.1/24"));
    let bin = BinaryUnderTest::spawn(
        ROUTER,
        &[
            "--backend",
            "kernel",
            "--netns",
            netns.name(),
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    )
    .await
    .expect("router-sidecar starts");
    let mut client =
        SliceRouterSidecarServiceClient::new(common::channel(grpc_addr(&bin).await).await);
    client
        .update_slice_gw_connection_context(context(&["10.1.1.2", "10.1.1.3"]))
        .await
        .expect("update");
    assert_eq!(
        netns.gateway_routes().get("10.2.0.0/16"),
        Some(&set(&["10.1.1.2", "10.1.1.3"]))
    );
    sigterm_exits_zero(bin).await;
    // Routes stay after the sidecar exits: the slice keeps forwarding.
    assert!(netns.gateway_routes().contains_key("10.2.0.0/16"));
}

/// A minimal HTTP/1.1 PUT with a JSON body; returns the status code and body.
async fn http_put_json(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect admin");
    let request = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read");
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status line");
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn gw_sidecar_memory_binary() {
    let bin = BinaryUnderTest::spawn(
        GW,
        &[
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--pod-name",
            "gw-bin-0",
            "--node-ip",
            "192.0.2.20",
            "--nsm-ip",
            "10.1.1.1",
            "--tunnel-interface",
            "tun0",
        ],
    )
    .await
    .expect("gw-sidecar starts");
    let addr = grpc_addr(&bin).await;
    let mut client = GwSidecarServiceClient::new(common::channel(addr).await);
    let status = client.get_status(()).await.expect("status").into_inner();
    assert_eq!(status.gateway_pod_name, "gw-bin-0");
    assert_eq!(status.node_ip, "192.0.2.20");
    assert_eq!(status.nsm_intf_status.expect("nsm").nsm_ip, "10.1.1.1");
    assert_eq!(
        status.tunnel_status.expect("tunnel").status,
        TunnelStatusType::GwTunnelStateUp as i32
    );

    // The admin call changes what GetStatus reports.
    let (code, _) = http_put_json(
        bin.admin_addr(),
        "/memory/gw/status",
        r#"{"nsmIp":"10.1.1.9","tunnel":{"netInterface":"tun0","packetLoss":100,"down":true}}"#,
    )
    .await;
    assert_eq!(code, 200);
    let status = client.get_status(()).await.expect("status").into_inner();
    assert_eq!(status.nsm_intf_status.expect("nsm").nsm_ip, "10.1.1.9");
    let tunnel = status.tunnel_status.expect("tunnel");
    assert_eq!(
        (tunnel.status, tunnel.packet_loss),
        (TunnelStatusType::GwTunnelStateDown as i32, 100)
    );
    let snapshot = http_get(bin.admin_addr(), "/memory/gw")
        .await
        .expect("snapshot");
    assert!(
        snapshot.body.contains(r#""nsmIp":"10.1.1.9""#),
        "{}",
        snapshot.body
    );

    assert_serving(addr, "sidecar.GwSidecarService").await;
    sigterm_exits_zero(bin).await;
}

#[tokio::test]
async fn bad_flags_fail_fast() {
    let output = tokio::process::Command::new(ROUTER)
        .args([
            "--backend",
            "memory",
            "--client-connection",
            "only-two,fields",
        ])
        .output()
        .await
        .expect("runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("POD,INTERFACE,NSM_IP,NSM_PEER_IP"));
}

/// A CA and a server certificate for localhost/127.0.0.1, made with openssl.
fn make_certificates(dir: &std::path::Path) -> Result<(), String> {
    let openssl = |args: &[&str]| -> Result<(), String> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .map_err(|error| format!("openssl not runnable: {error}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=capstan-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ])?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(|error| error.to_string())?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    ])
}

#[tokio::test]
async fn router_sidecar_serves_tls() {
    if !capstan_testkit::require("openssl, to make test certificates", on_path("openssl")) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    make_certificates(dir.path()).expect("openssl makes the test certificates");
    let cert = dir.path().join("server.pem");
    let key = dir.path().join("server.key");
    let bin = BinaryUnderTest::spawn(
        ROUTER,
        &[
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().expect("utf-8 path"),
            "--tls-key",
            key.to_str().expect("utf-8 path"),
        ],
    )
    .await
    .expect("router-sidecar starts with TLS");
    let addr = grpc_addr(&bin).await;

    let ca = std::fs::read(dir.path().join("ca.pem")).expect("ca");
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls config")
        .connect()
        .await
        .expect("TLS connect");
    let mut client = SliceRouterSidecarServiceClient::new(channel);
    client
        .update_slice_gw_connection_context(context(&["10.1.1.2"]))
        .await
        .expect("call over TLS");

    // Plaintext is refused.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2));
    let plaintext_works = match plain.connect().await {
        Ok(channel) => SliceRouterSidecarServiceClient::new(channel)
            .get_slice_router_client_connection_info(())
            .await
            .is_ok(),
        Err(_) => false,
    };
    assert!(
        !plaintext_works,
        "a TLS server must not answer plaintext gRPC"
    );

    sigterm_exits_zero(bin).await;
}

#[tokio::test]
async fn gw_sidecar_kernel_binary_in_a_namespace() {
    let Some(netns) = common::netns() else {
        return;
    };
    netns.veth("nsm0", "nsm0-peer", Some("10.1.1.1/24"));
    netns.veth("vpn0", "vpn0-peer", Some("10.9.0.1/24"));
    let bin = BinaryUnderTest::spawn_with_env(
        GW,
        &[
            "--backend",
            "kernel",
            "--netns",
            netns.name(),
            "--listen",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--pod-name",
            "gw-kernel-0",
        ],
        &[("NODE_IP", "192.0.2.30")],
    )
    .await
    .expect("gw-sidecar starts");
    let mut client = GwSidecarServiceClient::new(common::channel(grpc_addr(&bin).await).await);
    let status = client.get_status(()).await.expect("status").into_inner();
    assert_eq!(status.node_ip, "192.0.2.30");
    assert_eq!(status.gateway_pod_name, "gw-kernel-0");
    assert_eq!(status.nsm_intf_status.expect("nsm").nsm_ip, "10.1.1.1");
    assert_eq!(
        status.tunnel_status.expect("tunnel").status,
        TunnelStatusType::GwTunnelStateDown as i32,
        "no tun* interface"
    );
    client
        .update_connection_context(capstan_proto::sidecar::SliceGwConnectionContext {
            remote_slice_gw_vpn_ip: "10.9.0.2".into(),
            remote_slice_gw_nsm_subnet: "10.2.0.0/16".into(),
            ..Default::default()
        })
        .await
        .expect("connection context");
    assert_eq!(
        netns.gateway_routes().get("10.2.0.0/16"),
        Some(&set(&["10.9.0.2"]))
    );
    sigterm_exits_zero(bin).await;
}
