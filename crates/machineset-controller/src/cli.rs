//! The flags of `machineset-controller` (each with an environment variable); durations are Go
//! durations (`200ms`, `3m`), as in MCM.

use std::time::Duration;

use capstan_apis::machine::GoDuration;
use capstan_runtime::cli::CommonArgs;

fn parse_duration(text: &str) -> Result<Duration, String> {
    GoDuration::new(text).to_std().map_err(|e| e.to_string())
}

/// Keeps MachineSets at their replicas and rolls MachineDeployments from one template revision to
/// the next (Gardener machine-controller-manager compatible, API group
/// `machine.sapcloud.io/v1alpha1`). The Machines themselves are machineclass-controller's. Every
/// replica watches; only the elected leader writes.
#[derive(clap::Parser, Debug)]
#[command(name = "machineset-controller", version, about, long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Namespace of the MachineDeployments, MachineSets and Machines.
    #[arg(long, env = "MCM_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// MachineSets reconciled in parallel (MCM's `--concurrent-syncs`).
    #[arg(long, env = "MACHINE_SET_CONCURRENCY", default_value_t = 10,
          value_parser = capstan_runtime::cli::parse_count::<u16>)]
    pub set_concurrency: u16,
    /// MachineDeployments reconciled in parallel.
    #[arg(long, env = "MACHINE_DEPLOYMENT_CONCURRENCY", default_value_t = 10,
          value_parser = capstan_runtime::cli::parse_count::<u16>)]
    pub deployment_concurrency: u16,

    /// How often the leader looks for sets backed by too many Machines (MCM's safety controller).
    #[arg(long, env = "MACHINE_SAFETY_OVERSHOOTING_PERIOD", default_value = "1m", value_parser = parse_duration)]
    pub machine_safety_overshooting_period: Duration,
    /// Machines tolerated above a set's most (deployment replicas + maxSurge, or twice a
    /// standalone set's replicas) before it is frozen.
    #[arg(long, env = "SAFETY_UP", default_value_t = machineset_core::safety::DEFAULT_SAFETY_UP)]
    pub safety_up: i32,
    /// How far below the freeze limit the count must fall before the set is unfrozen.
    #[arg(long, env = "SAFETY_DOWN", default_value_t = machineset_core::safety::DEFAULT_SAFETY_DOWN)]
    pub safety_down: i32,

    /// How long a set or deployment waits after the first Machine change of a burst before it
    /// recounts, so that Machines turning Running together are one pass and one status write,
    /// not one each (`0s`: every change at once). Its own spec changes are handled at once.
    #[arg(long, env = "SETTLE_WINDOW", default_value = "100ms", value_parser = parse_duration)]
    pub settle_window: Duration,
    /// While a set's or deployment's Machines are being created, starting or deleted, its changed
    /// status is written at most once per this window (a reader sees it at most this old); at
    /// rest, and on a failure, at once (`0s`: every change at once).
    #[arg(long, env = "STATUS_BATCH_WINDOW", default_value = "2s", value_parser = parse_duration)]
    pub status_batch_window: Duration,

    /// Retry after a write conflict.
    #[arg(long, env = "CONFLICT_RETRY", default_value = "200ms", value_parser = parse_duration)]
    pub conflict_retry: Duration,
    /// First retry after a failed reconcile; repeated failures back off to ten times this.
    #[arg(long, env = "SHORT_RETRY", default_value = "5s", value_parser = parse_duration)]
    pub short_retry: Duration,
    /// Periodic resync of every set and deployment (MCM's 10 minutes).
    #[arg(long, env = "RESYNC_PERIOD", default_value = "10m", value_parser = parse_duration)]
    pub resync: Duration,
}

#[cfg(test)]
mod tests {
    use super::Args;
    use capstan_testkit::cli::assert_refused;
    use clap::Parser;

    #[test]
    fn zero_concurrency_is_refused_naming_the_flag() {
        for flag in ["--set-concurrency", "--deployment-concurrency"] {
            assert_refused::<Args>(
                &["machineset-controller", flag, "0"],
                flag,
                "must be at least 1",
            );
        }
        let args =
            Args::try_parse_from(["machineset-controller", "--resync", "1m"]).expect("parses");
        assert_eq!(args.resync, std::time::Duration::from_secs(60));
    }
}
