//! The NodeSLO metrics of the reference, next to the runtime's common controller metrics.
//!
//! Names follow Koordinator's slo-controller. prometheus-client speaks OpenMetrics, where a
//! counter's sample carries a `_total` suffix: `slo_controller_nodeslo_reconcile_count_total`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusReason {
    pub status: &'static str,
    pub reason: String,
}

#[derive(Clone, Debug, Default)]
pub struct SloMetrics {
    reconcile_count: Family<StatusReason, Counter>,
    spec_parse_count: Family<StatusReason, Counter>,
    nodeslos: Gauge,
}

impl SloMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let slo = registry.sub_registry_with_prefix("slo_controller");
        slo.register(
            "nodeslo_reconcile_count",
            "NodeSLO writes by outcome (succeeded|failed) and reason (createNodeSLO, updateNodeSLO, deleteNodeSLO)",
            metrics.reconcile_count.clone(),
        );
        slo.register(
            "nodeslo_spec_parse_count",
            "slo-controller-config key parses by outcome and reason (the key, or the problem)",
            metrics.spec_parse_count.clone(),
        );
        slo.register(
            "nodeslo_cached",
            "NodeSLOs in the controller's cache",
            metrics.nodeslos.clone(),
        );
        metrics
    }

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

    pub fn set_cached_nodeslos(&self, count: usize) {
        self.nodeslos.set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}
