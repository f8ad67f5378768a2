//! `kube-sim serve`: run the embedded API server as a process.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;
use capstan_runtime::cli::{CommonArgs, LogFormat};
use capstan_runtime::shutdown::Shutdown;
use capstan_runtime::telemetry;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "kube-sim",
    version,
    about = "An embedded Kubernetes API server for development and tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Kubernetes API until SIGTERM or SIGINT.
    Serve {
        /// Listen address (port 0 picks a free port).
        #[arg(long, env = "KUBE_SIM_ADDR", default_value = "127.0.0.1:6443")]
        addr: SocketAddr,
        /// Where to write a kubeconfig for this server once it is ready.
        #[arg(long, env = "KUBE_SIM_KUBECONFIG_OUT")]
        kubeconfig_out: Option<PathBuf>,
        /// Directory for persisted state: every acknowledged write survives a crash and restart.
        #[arg(long, env = "KUBE_SIM_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Events kept for watch resumption.
        #[arg(long, env = "KUBE_SIM_HISTORY", default_value_t = 10_000)]
        history: usize,
        /// Fault injection, as the JSON of `POST /_sim/faults` or `@path` to a file holding it,
        /// e.g. '{"seed":1,"errors":[{"rate":0.1,"code":500}],"watchMaxEvents":50}'.
        #[arg(long, env = "KUBE_SIM_FAULTS")]
        faults: Option<String>,
        /// Simulate workloads: Deployments and ReplicaSets get running, Ready Pods with pod IPs.
        #[arg(long, env = "KUBE_SIM_SIMULATE_WORKLOADS")]
        simulate_workloads: bool,
        /// IPv4 CIDR that simulated Pods get their `podIP` from.
        #[arg(long, env = "KUBE_SIM_POD_CIDR", default_value = "127.10.0.0/16")]
        pod_cidr: String,
        /// `IMAGE=DIR` (repeatable): containers of IMAGE (tag ignored) run as host processes,
        /// `DIR/<command[0]>` with their args and env (needs --simulate-workloads).
        #[arg(
            long = "exec-images",
            env = "KUBE_SIM_EXEC_IMAGES",
            value_delimiter = ','
        )]
        exec_images: Vec<String>,
        /// `pods/exec` runs the client's command on this host for every pod (not only for
        /// --exec-images containers). Off by default: it lets any client run host commands.
        #[arg(long, env = "KUBE_SIM_EXEC_HOST_COMMANDS")]
        exec_host_commands: bool,
        /// Back-off before restarting a crashing container the second time (doubling, capped at
        /// 30 times this), as kubelet's 10s and 5m.
        #[arg(long, env = "KUBE_SIM_RESTART_BACKOFF_SECONDS", default_value_t = 10.0)]
        restart_backoff_seconds: f64,
        /// Static bearer tokens, one `token,user,uid,"group1,group2"` per line (turns on
        /// authentication; the written kubeconfig then carries an admin token).
        #[arg(long, env = "KUBE_SIM_TOKEN_FILE")]
        token_file: Option<PathBuf>,
        /// `RBAC` authorizes from stored Roles and bindings (turns on authentication);
        /// `AlwaysAllow` allows every request.
        #[arg(long, env = "KUBE_SIM_AUTHORIZATION_MODE", default_value = "AlwaysAllow",
              value_parser = ["AlwaysAllow", "RBAC"])]
        authorization_mode: String,
        /// With authentication on, requests without credentials are `system:anonymous` (by
        /// default they are the admin, as kubectl sends no token over plain HTTP).
        #[arg(long, env = "KUBE_SIM_ANONYMOUS_REQUESTS")]
        anonymous_requests: bool,
        /// Serve HTTPS with a CA generated at start; the written kubeconfig carries the CA.
        #[arg(long, env = "KUBE_SIM_TLS")]
        tls: bool,
        /// Log format, as every Capstan binary.
        #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Log filter (an EnvFilter directive), as every Capstan binary.
        #[arg(long, env = "LOG_LEVEL", default_value = "info")]
        log_level: String,
        /// OTLP endpoint for traces, as every Capstan binary.
        #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
        otlp_endpoint: Option<String>,
    },
}

/// Installs the SIGTERM/SIGINT handlers (before the server announces itself, so that a signal
/// sent right after the ready line is a clean stop) and returns a future that waits for one.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli {
        command:
            Command::Serve {
                addr,
                kubeconfig_out,
                data_dir,
                history,
                faults,
                simulate_workloads,
                pod_cidr,
                exec_images,
                exec_host_commands,
                restart_backoff_seconds,
                token_file,
                authorization_mode,
                anonymous_requests,
                tls,
                log_format,
                log_level,
                otlp_endpoint,
            },
    } = Cli::parse();
    // Logs, traces and signal handling are the runtime's, as in every Capstan binary; kube-sim
    // has no kubeconfig, admin port or lease of its own (it serves /metrics and /livez itself).
    let telemetry_args = CommonArgs {
        log_format,
        log_level,
        otlp_endpoint,
        ..CommonArgs::default()
    };
    let telemetry = telemetry::init("kube-sim", &telemetry_args)?;
    let shutdown = Shutdown::on_signals()?;
    let config = kube_sim::Config {
        addr,
        history_size: history,
        faults: kube_sim::faults::FaultConfig::from_flag(faults.as_deref())
            .context("reading --faults")?,
        simulate_workloads,
        data_dir,
        tls,
        auth: kube_sim::auth::AuthConfig {
            token_file,
            rbac: authorization_mode == "RBAC",
            anonymous_requests,
            ..Default::default()
        },
        workloads: kube_sim::workloads::WorkloadOptions {
            pod_cidr,
            ..Default::default()
        },
        kubelet: kube_sim::kubelet::KubeletConfig {
            exec_images: exec_images
                .iter()
                .map(|f| kube_sim::kubelet::parse_exec_image(f))
                .collect::<Result<_, _>>()
                .context("reading --exec-images")?,
            exec_host_commands,
            restart_backoff: std::time::Duration::try_from_secs_f64(restart_backoff_seconds)
                .context("reading --restart-backoff-seconds")?,
            max_restart_backoff: std::time::Duration::try_from_secs_f64(
                restart_backoff_seconds * 30.0,
            )
            .context("reading --restart-backoff-seconds")?,
            ..Default::default()
        },
        ..Default::default()
    };
    let sim = kube_sim::KubeSim::start(config)
        .await
        .context("starting kube-sim")?;
    match &kubeconfig_out {
        Some(path) => {
            sim.write_kubeconfig(path)
                .with_context(|| format!("writing {}", path.display()))?;
            println!(
                "kube-sim serving {}; kubeconfig written to {}",
                sim.url(),
                path.display()
            );
        }
        None => println!("kube-sim serving {}", sim.url()),
    }
    shutdown.cancelled().await;
    sim.shutdown().await;
    tracing::info!("kube-sim stopped");
    telemetry.shutdown().await;
    Ok(())
}
