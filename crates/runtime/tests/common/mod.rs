//! What the runtime's integration tests share: the common flags of a binary that runs alone (no
//! kubeconfig, admin server on a free port, no leader election).

use capstan_runtime::cli::{CommonArgs, LeaderElectionArgs, LogFormat};

/// The common flags with `log_format` and, when given, an OTLP endpoint.
pub fn common_args(log_format: LogFormat, otlp_endpoint: Option<String>) -> CommonArgs {
    CommonArgs {
        kubeconfig: None,
        metrics_addr: "127.0.0.1:0".parse().expect("valid address"),
        log_format,
        log_level: "info".into(),
        otlp_endpoint,
        leader: LeaderElectionArgs {
            leader_elect: false,
            lease_name: None,
            lease_namespace: "default".into(),
            lease_duration_seconds: 15,
            lease_grace_seconds: 5,
            identity: None,
        },
    }
}
