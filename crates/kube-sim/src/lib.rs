//! kube-sim: an embedded Kubernetes API server that real clients (kubectl, kube-rs, client-go,
//! the Python client) cannot tell from kube-apiserver for the calls they make.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_sim::Error> {
//! let sim = kube_sim::KubeSim::start(kube_sim::Config::default()).await?; // 127.0.0.1:0
//! let client = sim.client()?; // a kube::Client for it
//! sim.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"))?; // for kubectl & co.
//! # drop(client);
//! sim.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! How a request flows: `server` runs an axum router whose one handler, in `testbed`, parses the
//! URL once into a `request_info::RequestInfo` (kube-apiserver's), authenticates (`auth`),
//! authorizes (`rbac`), counts (`accounting`) and injects faults (`faults`); `http::stream`
//! serves pod logs, exec, attach and port-forward, and `http` every other request: it serves
//! discovery and OpenAPI or looks the resource up in the `registry` (built-ins plus CRDs) and runs
//! the verb in `cluster` under the lock in `shared`: `schema` (CRD pruning/defaulting/
//! validation), `defaults` (built-in kinds), `patch` (JSON, merge, strategic), `apply`
//! (server-side apply and managedFields), `convert` (served version <-> storage), then `store`
//! (objects as serialized JSON, one resourceVersion counter, event history, broadcast to
//! watches; with a data directory `persistence` logs each event before it is applied,
//! `commit_log` fsyncs the log once per batch of concurrent writes before their responses go
//! out, and `snapshot` compacts the log; the store offers each change to the write `journal`
//! once a test journals its resource). `workloads` reacts to store events as the
//! controllers and kubelet would. Errors are `error::ApiError`, rendered as kube-apiserver's
//! `Status`.

pub mod accounting;
pub mod apply;
pub mod auth;
pub mod cluster;
pub mod commit_log;
pub mod convert;
pub mod defaults;
pub mod error;
pub mod faults;
mod http;
pub mod journal;
pub mod kubelet;
pub mod patch;
pub mod persistence;
pub mod protobuf;
pub mod rbac;
pub mod registry;
pub mod request_info;
pub mod schema;
pub mod selectors;
mod server;
pub mod shared;
pub mod snapshot;
pub mod store;
pub mod testbed;
pub mod tls;
pub mod util;
pub mod validation;
pub mod workloads;

pub use journal::ObjectWrite;
pub use server::{Config, Error, KubeSim};
