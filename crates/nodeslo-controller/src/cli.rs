//! The flags of `nodeslo-controller` (each with an environment variable).

use capstan_apis::slo::{CONFIG_NAME, CONFIG_NAMESPACE};
use capstan_runtime::cli::{CommonArgs, ShardingArgs};

/// Keeps exactly one NodeSLO per Node, its spec computed from the cluster SLO ConfigMap
/// (`koordinator-system/slo-controller-config`) and per-node selectors (Koordinator slo-controller
/// compatible, API group `slo.koordinator.sh/v1alpha1`). Every replica watches; only the elected
/// leader writes, or with `--shards auto` every replica writes its own share of the nodes.
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
    #[command(flatten)]
    pub sharding: ShardingArgs,
    /// With `--shards auto`: label Nodes with their shard too, so each replica caches only its
    /// Nodes (needs `patch nodes`; Nodes belong to the kubelet and the cluster admins, so this
    /// is off by default and every replica watches all Nodes).
    #[arg(
        long,
        env = "NODESLO_SHARD_NODE_LABELS",
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub shard_node_labels: bool,
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
