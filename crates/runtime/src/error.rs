use std::net::SocketAddr;
use std::path::PathBuf;

use crate::metrics::ErrorLabel;

/// Errors of the shared runtime: configuration, telemetry set-up, admin server and leader election.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("failed to read kubeconfig {path}: {source}")]
    KubeconfigRead {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("failed to infer the Kubernetes client configuration: {0}")]
    KubeconfigInfer(#[from] kube::config::InferConfigError),
    #[error("failed to build the Kubernetes client: {0}")]
    KubeClient(#[source] kube::Error),
    #[error("invalid log level directive {directive:?}: {source}")]
    LogFilter {
        directive: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("failed to install the tracing subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
    #[error("failed to build the OTLP span exporter: {0}")]
    OtlpExporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("failed to install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("failed to bind the admin server on {addr}: {source}")]
    AdminBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("admin server failed: {0}")]
    AdminServe(#[source] std::io::Error),
    #[error("admin server task failed: {0}")]
    TaskJoin(#[from] tokio::task::JoinError),
    #[error("invalid leader election settings: {0}")]
    LeaderConfig(String),
    #[error("leader election lease {lease} was lost while held")]
    LeaseLost { lease: String },
    #[error("leader election lease error: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
}

impl ErrorLabel for RuntimeError {
    fn metric_label(&self) -> &'static str {
        match self {
            Self::KubeconfigRead { .. } | Self::KubeconfigInfer(_) => "kubeconfig",
            Self::KubeClient(_) => "kube_client",
            Self::LogFilter { .. } | Self::Subscriber(_) => "logging",
            Self::OtlpExporter(_) => "otlp",
            Self::Signals(_) => "signals",
            Self::AdminBind { .. } | Self::AdminServe(_) | Self::TaskJoin(_) => "admin_server",
            Self::LeaderConfig(_) => "leader_config",
            Self::LeaseLost { .. } => "lease_lost",
            Self::Lease(_) => "lease",
        }
    }
}
