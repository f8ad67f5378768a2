//! What every Capstan binary shares: CLI conventions ([`cli`]), logs and traces ([`telemetry`]),
//! Prometheus metrics ([`metrics`], declared with [`metric_families!`]), the admin HTTP server
//! with `/metrics`, `/livez` and `/readyz` ([`admin`]), per-object retry backoff ([`backoff`]),
//! leader election on a Lease ([`leader`]) and graceful shutdown ([`shutdown`], [`service`]), and a
//! keyed work queue for controllers whose reconcile key is not one cached object ([`workqueue`]),
//! with a controller loop on it for controllers whose hand-offs are on a latency path
//! ([`runner`]). The controller kit ([`controller`]) puts them together for every binary, with
//! traced API and gRPC requests ([`http_trace`]), Events ([`events`]), API error questions
//! ([`kube_errors`]), status writes batched while an object is busy ([`status_batch`]) and
//! poison-tolerant locks ([`sync`]). [`sharding`] splits one controller's
//! objects among active-active replicas: a Lease per shard, a sharder labelling each object with
//! its shard, drains for handovers.
//!
//! A binary wires them in this order: parse [`cli::CommonArgs`], [`telemetry::init`], register
//! metrics on a `prometheus_client` registry, [`service::Service::start`] (admin server + leader
//! election), run its controllers until [`shutdown::Shutdown`] fires, then
//! [`service::Service::finish`] drains in the documented order.

pub mod admin;
pub mod backoff;
pub mod cli;
pub mod controller;
mod error;
pub mod events;
pub mod http_trace;
pub mod kube_errors;
pub mod leader;
pub mod lean;
pub mod metric_families;
pub mod metrics;
pub mod own_writes;
pub mod patch;
pub mod runner;
pub mod service;
pub mod sharding;
pub mod shutdown;
pub mod status_batch;
pub mod sync;
pub mod telemetry;
pub mod workqueue;

pub use error::RuntimeError;
pub use metrics::ErrorLabel;

/// For [`metric_families!`]: the `prometheus_client` the expansion names.
#[doc(hidden)]
pub use prometheus_client;
