//! SIGTERM drains in order: stop new work, finish in-flight work, release the lease, stop the
//! admin server last (so `/livez` answers throughout the drain).

use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use capstan_runtime::cli::{CommonArgs, LogFormat};
use capstan_runtime::service::Service;
use capstan_runtime::shutdown::Shutdown;
use capstan_testkit::process::http_get;
use common::common_args;
use prometheus_client::registry::Registry;

fn args() -> CommonArgs {
    common_args(LogFormat::Text, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_work_finishes_before_the_admin_server_stops() {
    let shutdown = Shutdown::new();
    let service = Service::start(
        "order-test",
        &args(),
        Registry::default(),
        None,
        shutdown.clone(),
    )
    .await
    .expect("starts");
    let addr = service.admin_addr();
    service.readiness().set_ready(true);
    assert!(service.leader().is_leader(), "no election: always leader");
    assert_eq!(http_get(addr, "/readyz").await.expect("readyz").status, 200);
    let metrics = http_get(addr, "/metrics").await.expect("metrics").body;
    assert!(
        metrics.contains(r#"capstan_build_info{service="order-test",version="#),
        "{metrics}"
    );
    assert!(metrics.contains("capstan_leader 1\n"), "{metrics}");

    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = {
        let events = events.clone();
        move |event: String| events.lock().expect("not poisoned").push(event)
    };

    // A watcher notes when the admin server stops answering.
    let watcher = {
        let record = record.clone();
        tokio::spawn(async move {
            loop {
                if http_get(addr, "/livez").await.is_err() {
                    record("admin stopped".into());
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    // An in-flight reconcile that is running when shutdown arrives and needs time to finish.
    let token = shutdown.token();
    let in_flight = {
        let record = record.clone();
        tokio::spawn(async move {
            token.cancelled().await;
            record("shutdown seen".into());
            tokio::time::sleep(Duration::from_millis(300)).await;
            let livez = http_get(addr, "/livez").await.map(|r| r.status);
            let readyz = http_get(addr, "/readyz").await.map(|r| r.status);
            record(format!("in-flight done livez={livez:?} readyz={readyz:?}"));
            42
        })
    };

    shutdown.trigger();
    let output = service
        .finish(async { in_flight.await.expect("in-flight task joins") })
        .await
        .expect("drains cleanly");
    assert_eq!(output, 42, "finish returns the in-flight output");
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("watcher sees the stop")
        .expect("watcher joins");

    let events = events.lock().expect("not poisoned").clone();
    assert_eq!(
        events,
        [
            "shutdown seen",
            "in-flight done livez=Ok(200) readyz=Ok(503)",
            "admin stopped",
        ],
        "livez stays up (readyz down) while draining, admin stops last"
    );
    assert!(shutdown.is_completed());
}

#[tokio::test]
async fn finish_without_a_signal_still_requests_shutdown_first() {
    let shutdown = Shutdown::new();
    let service = Service::start(
        "order-test",
        &args(),
        Registry::default(),
        None,
        shutdown.clone(),
    )
    .await
    .expect("starts");
    let seen = shutdown.clone();
    let was_triggered = service
        .finish(async move { seen.is_triggered() })
        .await
        .expect("drains");
    assert!(
        was_triggered,
        "in-flight work runs after the request to stop"
    );
}

#[tokio::test]
async fn run_keeps_controllers_going_until_shutdown_then_drains() {
    let shutdown = Shutdown::new();
    let service = Service::start(
        "order-test",
        &args(),
        Registry::default(),
        None,
        shutdown.clone(),
    )
    .await
    .expect("starts");
    let addr = service.admin_addr();
    let token = shutdown.token();
    let controllers = async move {
        let mut reconciles = 0_u32;
        while !token.is_cancelled() {
            reconciles += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        reconciles
    };
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        trigger.trigger();
    });
    let reconciles = tokio::time::timeout(Duration::from_secs(5), service.run(controllers))
        .await
        .expect("returns after shutdown")
        .expect("drains cleanly");
    assert!(
        reconciles >= 5,
        "controllers ran until shutdown ({reconciles})"
    );
    assert!(shutdown.is_completed());
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "admin server stopped"
    );
}

#[tokio::test]
async fn controllers_ending_early_still_drain_the_process() {
    let shutdown = Shutdown::new();
    let service = Service::start(
        "order-test",
        &args(),
        Registry::default(),
        None,
        shutdown.clone(),
    )
    .await
    .expect("starts");
    let output = tokio::time::timeout(Duration::from_secs(5), service.run(async { "watch ended" }))
        .await
        .expect("returns")
        .expect("drains");
    assert_eq!(output, "watch ended");
    assert!(shutdown.is_triggered() && shutdown.is_completed());
}
