//! kube-sim: an embedded Kubernetes API server that real clients (kubectl, kube-rs, client-go,
//! the Python client) cannot tell from kube-apiserver for the calls they make.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_sim::Error> {
//! let sim = kube_sim::KubeSim::start(kube_sim::Config::default()).await?;
//! let client = sim.client()?;
//! # drop(client);
//! sim.shutdown().await;
//! # Ok(()) }
//! ```

pub mod accounting;
pub mod apply;
pub mod auth;
pub mod bench;
pub mod cluster;
pub mod convert;
pub mod defaults;
pub mod error;
pub mod faults;
mod http;
pub mod patch;
pub mod persistence;
pub mod proto;
pub mod rbac;
pub mod registry;
pub mod request_info;
pub mod schema;
pub mod selectors;
mod server;
pub mod store;
pub mod testbed;
pub mod tls;
pub mod util;
pub mod workloads;

pub use server::{Config, Error, KubeSim};
