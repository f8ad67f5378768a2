//! The admin HTTP server: `GET /metrics` (OpenMetrics text), `/livez` and `/readyz`.
//!
//! It stops on [`Shutdown::completed`], not on the shutdown request, so liveness keeps answering
//! while the process drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

use crate::RuntimeError;
use crate::shutdown::Shutdown;

/// Content type of the OpenMetrics text exposition that `prometheus_client` encodes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether the process is ready; cloneable, starts not ready.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set_ready(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the admin server serves. The registry is complete before serving (metrics are registered
/// once at start-up; their values change through the metric handles).
#[derive(Clone, Debug)]
pub struct AdminState {
    pub registry: Arc<Registry>,
    pub readiness: Readiness,
}

impl AdminState {
    /// Admin state with a fresh [`Readiness`] (not ready).
    pub fn new(registry: Registry) -> Self {
        Self {
            registry: Arc::new(registry),
            readiness: Readiness::new(),
        }
    }
}

/// The admin routes, for embedding or testing without a socket.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds `addr` (port 0 picks a free port) and serves the admin routes until
/// `shutdown.completed()`. Returns the bound address and the server task.
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: Shutdown,
) -> Result<(SocketAddr, JoinHandle<Result<(), RuntimeError>>), RuntimeError> {
    serve_with(addr, state, Router::new(), shutdown).await
}

/// Like [`serve`], with `extra` routes (such as a sidecar's debug endpoints) merged in.
pub async fn serve_with(
    addr: SocketAddr,
    state: AdminState,
    extra: Router,
    shutdown: Shutdown,
) -> Result<(SocketAddr, JoinHandle<Result<(), RuntimeError>>), RuntimeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RuntimeError::AdminBind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| RuntimeError::AdminBind { addr, source })?;
    let app = router(state).merge(extra);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.completed().await })
            .await
            .map_err(RuntimeError::AdminServe)
    });
    Ok((bound, task))
}

async fn livez() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AdminState>) -> Response {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(error) => {
            tracing::error!(%error, "failed to encode metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to encode metrics",
            )
                .into_response()
        }
    }
}
