//! Lifecycle of one in-process server: bind, serve, hand out URL/kubeconfig/client, shut down.

use crate::cluster::Cluster;
use crate::shared::{Shared, WatchEnd};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Events kept for watch resumption; older resourceVersions get `410 Gone`.
    pub history_size: usize,
    /// How often watches that allow bookmarks receive one.
    pub bookmark_interval: Duration,
    /// Injected faults (none by default); changeable later with `KubeSim::set_faults`.
    pub faults: crate::faults::FaultConfig,
    /// Run the workload simulation (Deployments -> ReplicaSets -> running Pods, see `workloads.rs`).
    pub simulate_workloads: bool,
    pub workloads: crate::workloads::WorkloadOptions,
    /// Containers that really run (`--exec-images`), their logs and exec (see `kubelet/`).
    pub kubelet: crate::kubelet::KubeletConfig,
    /// Persist every acknowledged write here and replay it at start (see `persistence.rs`).
    pub data_dir: Option<std::path::PathBuf>,
    /// Bearer-token authentication and RBAC (off by default: every request is admin).
    pub auth: crate::auth::AuthConfig,
    /// Serve HTTPS with a CA generated at start (the kubeconfig and `client()` carry it).
    pub tls: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_size: 10_000,
            bookmark_interval: Duration::from_secs(60),
            faults: crate::faults::FaultConfig::default(),
            simulate_workloads: false,
            workloads: crate::workloads::WorkloadOptions::default(),
            kubelet: crate::kubelet::KubeletConfig::default(),
            data_dir: None,
            auth: crate::auth::AuthConfig::default(),
            tls: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot build a client: {0}")]
    Client(String),
    #[error(transparent)]
    Testbed(#[from] crate::testbed::TestbedError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot write the kubeconfig: {0}")]
    Io(#[from] std::io::Error),
}

/// A running kube-sim instance. Instances are independent: no global state.
pub struct KubeSim {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    /// Accounting, faults and admin endpoints (see `testbed.rs`).
    pub(crate) testbed: Arc<crate::testbed::Testbed>,
    /// The generated CA when serving HTTPS.
    pub(crate) tls: Option<Arc<crate::tls::TlsMaterial>>,
}

/// Serves the router on any listener (plain TCP or TLS) until shutdown.
async fn serve<L>(listener: L, app: axum::Router, shutdown: CancellationToken)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "kube-sim server stopped");
    }
}

impl KubeSim {
    /// Binds and starts serving; returns once the listener accepts connections.
    pub async fn start(mut config: Config) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.addr,
            source,
        })?;
        let shared = Arc::new(Shared::new(
            Cluster::new(config.history_size),
            addr.to_string(),
            config.bookmark_interval,
        ));
        let shutdown = shared.shutdown.clone();
        let tls = if config.tls {
            Some(Arc::new(crate::tls::TlsMaterial::generate(addr.ip())?))
        } else {
            None
        };
        // Every namespace's kube-root-ca.crt carries the CA clients verify this server with.
        if let Some(tls) = &tls {
            config.workloads.root_ca = tls.ca_pem.clone();
        }
        let testbed = crate::testbed::Testbed::start(&config, shared.clone())?;
        let app = testbed.router();
        let task = match &tls {
            Some(tls) => tokio::spawn(serve(tls.listener(listener), app, shutdown)),
            None => {
                use axum::serve::ListenerExt;
                let listener = listener.tap_io(|tcp| {
                    // Watch events and small replies must leave at once: with Nagle on, a write
                    // behind an unacknowledged one waits for the client's delayed ACK (~40 ms).
                    let _ = tcp.set_nodelay(true);
                });
                tokio::spawn(serve(listener, app, shutdown))
            }
        };
        Ok(Self {
            addr,
            shared,
            task,
            testbed,
            tls,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The CA certificate (PEM) when serving HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// A kubeconfig (YAML) whose current context points at this server, namespace `default`.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: {}\n{}contexts:\n- name: kube-sim\n  context:\n    cluster: kube-sim\n    user: kube-sim\n    namespace: default\ncurrent-context: kube-sim\nusers:\n- name: kube-sim\n  user: {}\npreferences: {{}}\n",
            self.url(),
            self.ca_pem()
                .map(|pem| format!(
                    "    certificate-authority-data: {}\n",
                    crate::util::base64(pem.as_bytes())
                ))
                .unwrap_or_default(),
            self.kubeconfig_user()
        )
    }

    /// Over HTTPS, client-go prompts for a password when a user has no credentials; a
    /// placeholder token (ignored while authentication is off) keeps kubectl non-interactive.
    fn kubeconfig_user(&self) -> String {
        let user = self.testbed.kubeconfig_user();
        if self.tls.is_some() && user == "{}" {
            return "{token: kube-sim}".into();
        }
        user
    }

    pub fn kubeconfig(&self) -> kube::config::Kubeconfig {
        kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())
            .expect("the generated kubeconfig is valid YAML")
    }

    /// Writes the kubeconfig to a file.
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> Result<(), Error> {
        std::fs::write(path, self.kubeconfig_yaml())?;
        Ok(())
    }

    /// A kube-rs client for this server.
    pub fn client(&self) -> Result<kube::Client, Error> {
        let uri = self
            .url()
            .parse()
            .map_err(|e: http::uri::InvalidUri| Error::Client(e.to_string()))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        if let Some(tls) = &self.tls {
            config.root_cert = Some(vec![tls.ca_der.clone()]);
        }
        self.testbed.authorize_client(&mut config);
        kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().store.resource_version()
    }

    /// Compacts the event history and ends every open watch with a `410 Gone` ERROR event: clients
    /// must re-list (a forced re-list, as after an etcd compaction).
    pub fn expire_watches(&self) {
        self.shared.lock().store.compact();
        self.shared.end_watches(WatchEnd::Expire);
    }

    /// Stops serving: open watches end, in-flight requests finish.
    pub async fn shutdown(self) {
        self.shared.shutdown.cancel();
        self.testbed.kubelet.shutdown().await;
        let _ = self.task.await;
    }
}
