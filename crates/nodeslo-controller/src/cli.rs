//! The flags of `nodeslo-controller` (each with an environment variable).

use capstan_apis::slo::{CONFIG_NAME, CONFIG_NAMESPACE};
use capstan_runtime::cli::CommonArgs;

/// Keeps exactly one NodeSLO per Node, its spec computed from the cluster SLO ConfigMap
/// (`koordinator-system/slo-controller-config`) and per-node selectors (Koordinator slo-controller
/// compatible, API group `slo.koordinator.sh/v1alpha1`). Every replica watches; only the elected
/// leader writes.
#[derive(clap::Parser, Debug)]
#[command(name = "nodeslo-controller", version, about, long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Namespace of the SLO ConfigMap.
    #[arg(long, env = "SLO_CONFIG_NAMESPACE", default_value = CONFIG_NAMESPACE)]
    pub config_namespace: String,
    /// Name of the SLO ConfigMap.
    #[arg(long, env = "SLO_CONFIG_NAME", default_value = CONFIG_NAME)]
    pub config_name: String,
    /// Reconciles running at once.
    #[arg(long, env = "NODESLO_WORKERS", default_value_t = 8,
          value_parser = capstan_runtime::cli::parse_count::<usize>)]
    pub workers: usize,
    /// Retry delay after a write conflict (the cache was stale), in milliseconds.
    #[arg(long, env = "NODESLO_CONFLICT_RETRY_MS", default_value_t = 200)]
    pub conflict_retry_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::Args;
    use capstan_testkit::cli::assert_refused;
    use clap::Parser;

    #[test]
    fn zero_workers_is_refused_naming_the_flag() {
        // 0 workers would reconcile nothing.
        assert_refused::<Args>(
            &["nodeslo-controller", "--workers", "0"],
            "--workers",
            "must be at least 1",
        );
        let args = Args::try_parse_from(["nodeslo-controller", "--workers", "3"]).expect("3");
        assert_eq!(args.workers, 3);
    }
}
