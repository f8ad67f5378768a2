//! The flags of `gw-recycler` (each with an environment variable); durations are Go durations
//! (`300ms`, `5m`, `1h`), as in KubeSlice.

use std::path::PathBuf;
use std::time::Duration;

use capstan_apis::networking::DEFAULT_NAMESPACE;
use capstan_runtime::cli::CommonArgs;

use crate::recycler::Allowed;
use crate::trigger;

/// Which side of a gateway pair this instance may serve.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Role {
    /// Per recycle, from the local SliceGateway of the pair and its host type.
    #[default]
    Auto,
    /// Only orchestrate: own the state machine, write `spec.state` / `spec.request`.
    Server,
    /// Only perform the server's requests and write `status.client.response`.
    Client,
}

impl Role {
    /// The `controller` label of this instance's reconcile metrics.
    pub fn controller_name(self) -> &'static str {
        match self {
            Self::Auto => "gw-recycler",
            Self::Server => "gw-recycler-server",
            Self::Client => "gw-recycler-client",
        }
    }

    pub(crate) fn allowed(self) -> Allowed {
        match self {
            Self::Auto => Allowed::Auto,
            Self::Server => Allowed::Only(gw_recycler_core::role::Role::Server),
            Self::Client => Allowed::Only(gw_recycler_core::role::Role::Client),
        }
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    capstan_apis::duration::parse_go(text).map_err(|e| e.to_string())
}

/// A duration that must be more than zero: a step timeout or a sidecar call timeout of 0 would
/// fail every wait or call at once.
fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!(
            "must be more than 0 ({text:?} would fail every wait at once)"
        ));
    }
    Ok(duration)
}

/// Replaces slice gateway deployments make-before-break through a WorkerSliceGwRecycler state
/// machine on the hub cluster (KubeSlice worker-operator compatible), and reconciles the local
/// slice gateways' deployments, pod status and router next hops. Run one per worker cluster.
#[derive(clap::Parser, Debug)]
#[command(name = "gw-recycler", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Which side of a gateway pair this instance plays.
    #[arg(long, env = "GW_RECYCLER_ROLE", value_enum, default_value_t = Role::Auto)]
    pub role: Role,

    /// Kubeconfig of the hub cluster holding the WorkerSliceGwRecyclers.
    #[arg(long, env = "HUB_KUBECONFIG")]
    pub hub_kubeconfig: Option<PathBuf>,

    /// Project namespace on the hub.
    #[arg(long, env = "HUB_NAMESPACE")]
    pub hub_namespace: Option<String>,

    /// Namespace of the SliceGateways, gateway Deployments and router on this worker.
    #[arg(long, env = "GW_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,

    /// A waiting recycle step older than this fails into error_state (Go duration).
    #[arg(long, env = "STEP_TIMEOUT", default_value = "5m", value_parser = parse_positive_duration)]
    pub step_timeout: Duration,

    /// Pause between moving the routes and removing the old gateway (Go duration). As in
    /// KubeSlice it delays the server side only; it must be shorter than --step-timeout.
    #[arg(long, env = "DRAIN_DELAY", default_value = "5s", value_parser = parse_duration)]
    pub drain_delay: Duration,

    /// How long a finished recycle is kept before it is deleted (Go duration).
    #[arg(long, env = "RETENTION", default_value = "1h", value_parser = parse_duration)]
    pub retention: Duration,

    /// Gateway instances per SliceGateway (at least 1).
    #[arg(long, env = "GATEWAY_INSTANCES", default_value_t = 2,
          value_parser = capstan_runtime::cli::parse_count::<u32>)]
    pub gateway_instances: u32,

    /// Image of the gateway pods (runs `gw-sidecar`). Default: Capstan's image at this version.
    #[arg(long, env = "GATEWAY_IMAGE")]
    pub gateway_image: Option<String>,

    /// Extra `gw-sidecar` argument for the gateway pods (repeatable).
    #[arg(long = "gateway-arg", env = "GATEWAY_ARGS", value_delimiter = ' ')]
    pub gateway_args: Vec<String>,

    /// gRPC port of the router and gateway sidecars.
    #[arg(long, env = "SIDECAR_PORT", default_value_t = 5000)]
    pub sidecar_port: u16,

    /// Timeout of one sidecar call (Go duration).
    #[arg(long, env = "SIDECAR_TIMEOUT", default_value = "2s", value_parser = parse_positive_duration)]
    pub sidecar_timeout: Duration,

    /// How often the sidecars of a SliceGateway's running pods are asked again with no event
    /// (Go duration): a tunnel that goes DOWN leaves the router's next hops within about this long.
    #[arg(long, env = "STATUS_INTERVAL", default_value = "10s", value_parser = parse_positive_duration)]
    pub status_interval: Duration,

    /// Recycle a gateway whose node holds more gateway pods than its share
    /// (ceil(pods/nodes)) while more than one node is labelled `kubeslice.io/node-type=gateway`.
    #[arg(long, env = "REBALANCE")]
    pub rebalance: bool,

    #[command(flatten)]
    pub common: CommonArgs,
}

impl Args {
    /// The command line, with the checks that span flags; a contradiction exits with clap's
    /// usage error (exit code 2), as a malformed flag does.
    pub fn parse_checked() -> Self {
        let args = <Self as clap::Parser>::parse();
        if let Err(error) = args.check() {
            error.exit()
        }
        args
    }

    /// Flags that each parse but cannot work together.
    pub fn check(&self) -> Result<(), clap::Error> {
        if self.command.is_none() && self.drain_delay >= self.step_timeout {
            return Err(<Self as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "--drain-delay ({:?}) must be shorter than --step-timeout ({:?}): the old \
                     gateway is deleted only after the drain delay, so every recycle would time \
                     out in that step; lower --drain-delay or raise --step-timeout",
                    self.drain_delay, self.step_timeout
                ),
            ));
        }
        Ok(())
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Create a WorkerSliceGwRecycler on the hub (and optionally follow it).
    Trigger(trigger::TriggerArgs),
}

#[cfg(test)]
mod tests {
    use super::Args;
    use capstan_testkit::cli::assert_refused;
    use clap::Parser;

    #[test]
    fn zero_gateway_instances_is_refused_naming_the_flag() {
        // 0 instances would give no gateway a deployment.
        assert_refused::<Args>(
            &["gw-recycler", "--gateway-instances", "0"],
            "--gateway-instances",
            "must be at least 1",
        );
        let args = Args::try_parse_from(["gw-recycler", "--gateway-instances", "3"]).expect("3");
        assert_eq!(args.gateway_instances, 3);
    }

    #[test]
    fn a_zero_timeout_or_interval_is_refused_naming_the_flag_and_zero_delays_are_kept() {
        // A zero status interval would ask the sidecars in a busy loop.
        // A zero timeout fails every wait at once.
        for flag in ["--step-timeout", "--sidecar-timeout", "--status-interval"] {
            assert_refused::<Args>(&["gw-recycler", flag, "0s"], flag, "must be more than 0");
        }
        // No drain, and deleting a finished recycle at once, are meaningful choices.
        let args =
            Args::try_parse_from(["gw-recycler", "--drain-delay", "0s", "--retention", "0s"])
                .expect("zero delays");
        assert!(args.drain_delay.is_zero() && args.retention.is_zero());
        let err = Args::try_parse_from(["gw-recycler", "--step-timeout", "5"])
            .expect_err("a unitless duration");
        assert!(err.to_string().contains("--step-timeout"), "{err}");
    }

    #[test]
    fn a_drain_delay_not_shorter_than_the_step_timeout_is_refused_naming_both() {
        // Every deletion step would wait out its own timeout.
        for drain in ["5m", "10m"] {
            let args = Args::try_parse_from([
                "gw-recycler",
                "--drain-delay",
                drain,
                "--step-timeout",
                "5m",
            ])
            .expect("each flag parses");
            let err = args.check().expect_err("the pair is refused");
            assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
            let text = err.to_string();
            assert!(
                text.contains("--drain-delay") && text.contains("--step-timeout (300s)"),
                "{text}"
            );
        }
        let args = Args::try_parse_from(["gw-recycler", "--drain-delay", "299s"]).expect("parses");
        args.check()
            .expect("a drain shorter than the 5m default timeout");
    }
}
