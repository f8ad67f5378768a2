//! The start-up and shutdown sequence shared by every binary.

use std::future::Future;
use std::net::SocketAddr;

use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

use crate::RuntimeError;
use crate::admin::{self, AdminState, Readiness};
use crate::cli::CommonArgs;
use crate::leader::{LeaderElection, LeaderHandle, LeadershipEnd};
use crate::shutdown::Shutdown;

/// A running binary's shared parts: admin server, readiness, leader election and shutdown.
#[derive(Debug)]
pub struct Service {
    name: String,
    shutdown: Shutdown,
    readiness: Readiness,
    leader: LeaderHandle,
    admin_addr: SocketAddr,
    admin_task: JoinHandle<Result<(), RuntimeError>>,
}

impl Service {
    /// Serves the admin endpoints on `args.metrics_addr` (logging `admin server listening on
    /// ADDR`, which process tests parse) and starts leader election on the Lease named
    /// `--lease-name` or `name`. The client is only needed with `--leader-elect`; when `None`, it
    /// is built from the flags then. Adds `capstan_build_info` and `capstan_leader` to `registry`.
    pub async fn start(
        name: &str,
        args: &CommonArgs,
        registry: Registry,
        client: Option<kube::Client>,
        shutdown: Shutdown,
    ) -> Result<Self, RuntimeError> {
        let mut registry = registry;
        crate::metrics::register_build_info(&mut registry, name, env!("CARGO_PKG_VERSION"));
        let leader_gauge = crate::metrics::register_leader_gauge(&mut registry);
        let state = AdminState::new(registry);
        let readiness = state.readiness.clone();
        let (admin_addr, admin_task) =
            admin::serve(args.metrics_addr, state, shutdown.clone()).await?;
        tracing::info!(service = name, "admin server listening on {admin_addr}");
        let client = match client {
            Some(client) => Some(client),
            None if args.leader.leader_elect => Some(args.kube_client_for(name).await?),
            None => None,
        };
        let leader = LeaderElection::start(client, &args.leader, name, shutdown.clone())?;
        tokio::spawn(follow_leadership(leader.subscribe(), leader_gauge));
        Ok(Self {
            name: name.to_owned(),
            shutdown,
            readiness,
            leader,
            admin_addr,
            admin_task,
        })
    }

    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    pub fn leader(&self) -> &LeaderHandle {
        &self.leader
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Runs `controllers` (which live until shutdown is requested, then finish their in-flight
    /// work and return) and then drains with [`finish`](Self::finish). Controllers that return
    /// before any shutdown request also end the process, through the same drain.
    pub async fn run<F: Future>(self, controllers: F) -> Result<F::Output, RuntimeError> {
        let mut controllers = std::pin::pin!(controllers);
        let stopped_early = tokio::select! {
            // Shutdown first: controllers that return because of it are draining, not failing.
            biased;
            () = self.shutdown.cancelled() => None,
            output = &mut controllers => Some(output),
        };
        match stopped_early {
            Some(output) => {
                tracing::warn!(service = %self.name, "controllers stopped before shutdown was requested");
                self.finish(async { output }).await
            }
            None => self.finish(controllers).await,
        }
    }

    /// Drains in the documented order (see [`crate::shutdown`]): requests shutdown and turns
    /// `/readyz` to 503, awaits `in_flight` (the controllers finishing running reconciles),
    /// releases the lease, then stops the admin server. Returns `in_flight`'s output, or
    /// [`RuntimeError::LeaseLost`] when leadership was lost (exit non-zero).
    pub async fn finish<F: Future>(self, in_flight: F) -> Result<F::Output, RuntimeError> {
        self.shutdown.trigger();
        self.readiness.set_ready(false);
        let output = in_flight.await;
        tracing::info!(service = %self.name, "in-flight work finished");
        let released = self.leader.release().await;
        if let Ok(end @ (LeadershipEnd::Released | LeadershipEnd::Standby)) = &released {
            tracing::info!(service = %self.name, ?end, "leader election stopped");
        }
        self.shutdown.complete();
        let served = self.admin_task.await;
        tracing::info!(service = %self.name, "admin server stopped");
        released?;
        served??;
        Ok(output)
    }
}

/// Mirrors leadership into the `capstan_leader` gauge until the election ends.
async fn follow_leadership(
    mut leadership: tokio::sync::watch::Receiver<bool>,
    gauge: prometheus_client::metrics::gauge::Gauge,
) {
    loop {
        let is_leader = *leadership.borrow_and_update();
        gauge.set(i64::from(is_leader));
        if leadership.changed().await.is_err() {
            return;
        }
    }
}
