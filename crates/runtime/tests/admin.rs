//! The admin server over real HTTP on port 0.

use std::time::Duration;

use capstan_runtime::admin::{self, AdminState, OPENMETRICS_CONTENT_TYPE};
use capstan_runtime::metrics::ControllerMetrics;
use capstan_runtime::shutdown::Shutdown;
use capstan_testkit::process::http_get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

fn loopback() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().expect("valid address")
}

#[tokio::test]
async fn livez_is_ok_and_readyz_follows_readiness() {
    let state = AdminState::new(Registry::default());
    let readiness = state.readiness.clone();
    let shutdown = Shutdown::new();
    let (addr, server) = admin::serve(loopback(), state, shutdown.clone())
        .await
        .expect("binds");
    assert_ne!(addr.port(), 0, "the bound port is reported");

    let livez = http_get(addr, "/livez").await.expect("livez answers");
    assert_eq!((livez.status, livez.body.as_str()), (200, "ok"));

    assert_eq!(http_get(addr, "/readyz").await.expect("readyz").status, 503);
    readiness.set_ready(true);
    assert_eq!(http_get(addr, "/readyz").await.expect("readyz").status, 200);
    readiness.set_ready(false);
    assert_eq!(http_get(addr, "/readyz").await.expect("readyz").status, 503);

    assert_eq!(http_get(addr, "/nope").await.expect("answers").status, 404);

    shutdown.complete();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server stops on completion")
        .expect("task joins")
        .expect("server ran cleanly");
}

#[tokio::test]
async fn metrics_serves_live_values_as_openmetrics() {
    let mut registry = Registry::default();
    let controller = ControllerMetrics::register(&mut registry, "machineclass");
    let custom = Counter::<u64>::default();
    registry.register("mcm_cloud_api_requests", "Cloud API calls", custom.clone());
    let shutdown = Shutdown::new();
    let (addr, _server) = admin::serve(loopback(), AdminState::new(registry), shutdown.clone())
        .await
        .expect("binds");

    // Values change after the registry is frozen behind the server.
    custom.inc_by(3);
    drop(controller.measure("Machine"));

    let response = http_get(addr, "/metrics").await.expect("metrics answers");
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some(OPENMETRICS_CONTENT_TYPE)
    );
    assert!(
        response.body.contains("mcm_cloud_api_requests_total 3\n"),
        "{}",
        response.body
    );
    assert!(
        response.body.contains(
            r#"capstan_controller_reconciles_total{controller="machineclass",kind="Machine"} 1"#
        ),
        "{}",
        response.body
    );
    assert!(response.body.ends_with("# EOF\n"), "{}", response.body);
    shutdown.complete();
}

#[tokio::test]
async fn server_keeps_answering_while_draining_and_stops_on_completion() {
    let shutdown = Shutdown::new();
    let (addr, server) = admin::serve(
        loopback(),
        AdminState::new(Registry::default()),
        shutdown.clone(),
    )
    .await
    .expect("binds");
    shutdown.trigger();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !server.is_finished(),
        "a shutdown request alone does not stop it"
    );
    assert_eq!(
        http_get(addr, "/livez").await.expect("still up").status,
        200
    );

    shutdown.complete();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("stops")
        .expect("joins")
        .expect("clean");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the port is closed once stopped"
    );
}

#[tokio::test]
async fn a_taken_port_is_a_bind_error() {
    let taken = std::net::TcpListener::bind(loopback()).expect("binds");
    let addr = taken.local_addr().expect("has address");
    let error = admin::serve(addr, AdminState::new(Registry::default()), Shutdown::new())
        .await
        .expect_err("port in use");
    assert!(
        matches!(error, capstan_runtime::RuntimeError::AdminBind { addr: a, .. } if a == addr),
        "{error}"
    );
}

#[tokio::test]
async fn extra_routes_are_served_beside_the_admin_ones() {
    let extra = axum::Router::new().route("/debug/routes", axum::routing::get(|| async { "[]" }));
    let shutdown = Shutdown::new();
    let (addr, _server) = admin::serve_with(
        loopback(),
        AdminState::new(Registry::default()),
        extra,
        shutdown.clone(),
    )
    .await
    .expect("binds");
    let debug = http_get(addr, "/debug/routes").await.expect("answers");
    assert_eq!((debug.status, debug.body.as_str()), (200, "[]"));
    assert_eq!(http_get(addr, "/livez").await.expect("answers").status, 200);
    shutdown.complete();
}
