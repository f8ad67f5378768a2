//! The sidecar shim: `router-sidecar` and `gw-sidecar`, gRPC servers
//! wire-compatible with KubeSlice's `router.SliceRouterSidecarService` and
//! `sidecar.GwSidecarService`.
//!
//! - [`router`]: the router sidecar (ECMP routes), [`router::RouterBackend`] with
//!   [`router::kernel::KernelRouter`] and [`router::memory::MemoryRouter`].
//! - [`gw`]: the gateway sidecar (pod status, route to the remote subnet, QoS),
//!   [`gw::GwBackend`] with [`gw::kernel::KernelGw`] and [`gw::memory::MemoryGw`].
//! - [`server`]: flags, the tonic server (health, metrics, TLS, graceful shutdown).
//! - [`metrics`]: the gRPC metrics tower layer.
//!
//! Validation, planning and tunnel health are pure functions; only the backends
//! do I/O.

pub mod backend;
pub mod gw;
pub mod kernel_cache;
pub mod metrics;
pub mod net;
pub mod netns;
pub mod router;
pub mod server;
