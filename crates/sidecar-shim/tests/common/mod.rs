//! Helpers shared by the integration tests: in-process servers on port 0 and
//! throw-away network namespaces for the kernel backends.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tonic::server::NamedService;

/// A server running in this process; stops (and drains) when dropped.
pub type ServerGuard = sidecar_shim::server::SpawnedServer;

pub async fn bind_local() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0")
}

/// Serves `service` with the production stack (health, metrics layer) on `listener`.
pub fn serve_on<S>(listener: TcpListener, service: S) -> ServerGuard
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    sidecar_shim::server::spawn(listener, service).expect("local address of the test listener")
}

pub async fn serve<S>(service: S) -> ServerGuard
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    serve_on(bind_local().await, service)
}

pub async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to test server")
}

/// A network namespace created for one test, deleted on drop (the test kit's).
pub use capstan_testkit::netns::Netns;

/// A namespace for one test; `None` when the machine cannot (the test then returns: a loud skip,
/// or a failure under `CAPSTAN_REQUIRE_ALL_TESTS=1`).
pub fn netns() -> Option<Netns> {
    Netns::create_or_skip("capstan-t")
}

/// `["a", "b"]` as an owned set, for comparing route views.
pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// One `#[tokio::test]` per scenario and backend: `memory::<scenario>` on the suite's
/// `memory_harness()`, `kernel::<scenario>` on its `kernel_harness()` (which returns `None`, a
/// loud skip, where namespaces cannot be made). Each scenario is `async fn(&mut Harness)`.
// Only the two suites invoke it; the other test binaries that share this module do not.
#[allow(unused_macros)]
macro_rules! both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $scenario() {
                    let mut harness = super::memory_harness().await;
                    super::$scenario(&mut harness).await;
                }
            )*
        }
        mod kernel {
            $(
                #[tokio::test]
                async fn $scenario() {
                    let Some(mut harness) = super::kernel_harness().await else {
                        return;
                    };
                    super::$scenario(&mut harness).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_backends;
