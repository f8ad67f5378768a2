//! The NodeSLO metrics of the reference, next to the runtime's common controller metrics.
//!
//! Names follow Koordinator's slo-controller. prometheus-client speaks OpenMetrics, where a
//! counter's sample carries a `_total` suffix: `slo_controller_nodeslo_reconcile_count_total`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusReason {
    pub status: &'static str,
    pub reason: String,
}

capstan_runtime::metric_families! {
    #[derive(Clone, Debug)]
    pub struct SloMetrics {
        /// NodeSLO writes by outcome (succeeded|failed) and reason (createNodeSLO, updateNodeSLO,
        /// deleteNodeSLO)
        reconcile_count: Family<StatusReason, Counter> = "slo_controller_nodeslo_reconcile_count",
        /// slo-controller-config key parses by outcome and reason (the key, or the problem)
        spec_parse_count: Family<StatusReason, Counter> = "slo_controller_nodeslo_spec_parse_count",
        /// NodeSLOs in the controller's cache
        nodeslos: Gauge = "slo_controller_nodeslo_cached",
        /// Nodes in the controller's cache (Capstan's: beside the NodeSLO count it shows Nodes
        /// still waiting for their NodeSLO, the chart's NodeSLOsMissing alert)
        nodes: Gauge = "capstan_nodeslo_nodes_cached",
    }
}

impl SloMetrics {
    pub fn write(&self, succeeded: bool, reason: &'static str) {
        let status = if succeeded { "succeeded" } else { "failed" };
        self.reconcile_count
            .get_or_create(&StatusReason {
                status,
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn parse(&self, succeeded: bool, reason: &str) {
        let status = if succeeded { "succeeded" } else { "failed" };
        self.spec_parse_count
            .get_or_create(&StatusReason {
                status,
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The sizes of the two caches, after each watch event.
    pub fn set_cached(&self, nodes: usize, nodeslos: usize) {
        self.nodes.set(i64::try_from(nodes).unwrap_or(i64::MAX));
        self.nodeslos
            .set(i64::try_from(nodeslos).unwrap_or(i64::MAX));
    }
}
