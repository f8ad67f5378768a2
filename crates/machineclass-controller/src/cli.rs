//! The flags of `machineclass-controller` (each with an environment variable); durations are Go
//! durations (`200ms`, `3m`, `2h`), as in MCM.

use std::time::Duration;

use capstan_apis::machine::GoDuration;
use capstan_runtime::cli::{CommonArgs, ShardingArgs};
use machineclass_core::driver_error::RetryPeriods;
use machineclass_core::validate::MachineTimeouts;

fn parse_duration(text: &str) -> Result<Duration, String> {
    GoDuration::new(text).to_std().map_err(|e| e.to_string())
}

/// Guards MachineClasses with finalizers while Machines use them, and drives the Machine
/// lifecycle through a provider driver (Gardener machine-controller-manager compatible, API group
/// `machine.sapcloud.io/v1alpha1`). Every replica watches; only the elected leader writes, unless
/// `--shards auto` gives each replica its share of the Machines.
#[derive(clap::Parser, Debug)]
#[command(name = "machineclass-controller", version, about, long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,

    /// `--shards off|auto` (ring `machineclass` over Machines; see the crate docs).
    #[command(flatten)]
    pub sharding: ShardingArgs,

    /// Namespace of the MachineClasses, Machines and their Secrets.
    #[arg(long, env = "MCM_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// Provider driver: `sim` (in-process simulated provider) or `grpc://host:port`.
    #[arg(long, env = "MACHINE_DRIVER", default_value = "sim")]
    pub driver: String,

    /// Simulated provider: time until a new VM's Node turns Ready (Go duration).
    #[arg(long, env = "SIM_READY_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub sim_ready_delay: Duration,

    /// Retry after a write conflict.
    #[arg(long, env = "CONFLICT_RETRY", default_value = "200ms", value_parser = parse_duration)]
    pub conflict_retry: Duration,
    /// Short retry (transient errors, waiting for a dependency).
    #[arg(long, env = "SHORT_RETRY", default_value = "5s", value_parser = parse_duration)]
    pub short_retry: Duration,
    /// Medium retry (non-transient driver errors).
    #[arg(long, env = "MEDIUM_RETRY", default_value = "3m", value_parser = parse_duration)]
    pub medium_retry: Duration,
    /// Long retry (periodic resync, invalid input).
    #[arg(long, env = "LONG_RETRY", default_value = "10m", value_parser = parse_duration)]
    pub long_retry: Duration,
    /// Retry after a `ResourceExhausted` driver error.
    #[arg(long, env = "RESOURCE_EXHAUSTED_RETRY", default_value = "3m", value_parser = parse_duration)]
    pub resource_exhausted_retry: Duration,

    /// Default `creationTimeout` of Machines that do not set one.
    #[arg(long, env = "MACHINE_CREATION_TIMEOUT", default_value = "20m", value_parser = parse_duration)]
    pub machine_creation_timeout: Duration,
    /// Default `healthTimeout` of Machines that do not set one.
    #[arg(long, env = "MACHINE_HEALTH_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub machine_health_timeout: Duration,
    /// Default `drainTimeout` of Machines that do not set one.
    #[arg(long, env = "MACHINE_DRAIN_TIMEOUT", default_value = "2h", value_parser = parse_duration)]
    pub machine_drain_timeout: Duration,

    /// How often the leader lists each class's VMs and deletes those no Machine accounts for
    /// (MCM's safety controller).
    #[arg(long, env = "MACHINE_SAFETY_ORPHAN_VMS_PERIOD", default_value = "15m", value_parser = parse_duration)]
    pub machine_safety_orphan_vms_period: Duration,

    /// Machines reconciled in parallel.
    #[arg(long, env = "MACHINE_CONCURRENCY", default_value_t = 10,
          value_parser = capstan_runtime::cli::parse_count::<u16>)]
    pub machine_concurrency: u16,
    /// MachineClasses and Secrets reconciled in parallel.
    #[arg(long, env = "CLASS_CONCURRENCY", default_value_t = 4,
          value_parser = capstan_runtime::cli::parse_count::<u16>)]
    pub class_concurrency: u16,
}

impl Args {
    /// Refuses flag combinations that cannot run: `--shards auto` needs `--leader-elect` (the
    /// leader runs the sharder and the class-wide work, and the election's identity, `POD_NAME`,
    /// is the shard id).
    pub fn check(&self) -> Result<(), String> {
        self.sharding.check(
            &self.common.leader,
            "assigns Machines to shards and runs the MachineClass, Secret and orphan-VM work",
        )
    }

    pub fn machine_timeouts(&self) -> MachineTimeouts {
        MachineTimeouts {
            creation: self.machine_creation_timeout,
            health: self.machine_health_timeout,
            drain: self.machine_drain_timeout,
            disable_health_timeout: false,
        }
    }

    pub fn retry_periods(&self) -> RetryPeriods {
        RetryPeriods {
            conflict: self.conflict_retry,
            short: self.short_retry,
            medium: self.medium_retry,
            long: self.long_retry,
            resource_exhausted: self.resource_exhausted_retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Args;
    use capstan_testkit::cli::assert_refused;
    use clap::Parser;

    #[test]
    fn zero_concurrency_is_refused_naming_the_flag() {
        // 0 workers would reconcile nothing.
        for flag in ["--machine-concurrency", "--class-concurrency"] {
            assert_refused::<Args>(
                &["machineclass-controller", flag, "0"],
                flag,
                "must be at least 1",
            );
        }
        let err = Args::try_parse_from(["machineclass-controller", "--class-concurrency", "70000"])
            .expect_err("past u16");
        assert!(err.to_string().contains("70000 is too large"), "{err}");
        let args = Args::try_parse_from(["machineclass-controller", "--machine-concurrency", "2"])
            .expect("2");
        assert_eq!(args.machine_concurrency, 2);
    }

    #[test]
    fn sharding_is_off_by_default_and_auto_needs_leader_election() {
        let args = Args::try_parse_from(["machineclass-controller"]).expect("defaults");
        assert!(!args.sharding.enabled());
        assert_eq!(args.check(), Ok(()));
        let alone =
            Args::try_parse_from(["machineclass-controller", "--shards", "auto"]).expect("parses");
        let refused = alone.check().expect_err("auto without election");
        assert!(
            refused.contains("--shards auto") && refused.contains("--leader-elect"),
            "{refused}"
        );
        let elected = Args::try_parse_from([
            "machineclass-controller",
            "--shards",
            "auto",
            "--leader-elect",
        ])
        .expect("parses");
        assert!(elected.sharding.enabled());
        assert_eq!(elected.check(), Ok(()));
    }
}
