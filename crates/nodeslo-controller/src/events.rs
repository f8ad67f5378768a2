//! Bad input the NodeSLO controller reports as Warning Events: problems in the SLO ConfigMap
//! (once per ConfigMap version) and a Node's unparsable bandwidth annotation (once per value).

use capstan_runtime::events::{Event, truncate};
use capstan_runtime::sync::lock;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::{Resource, ResourceExt};
use nodeslo_core::ConfigProblem;

use crate::controller::NodeSloController;

impl NodeSloController {
    /// Logs the ConfigMap's problems and counts its keys' parses (every replica: its own log
    /// and metrics).
    pub(crate) fn log_config_problems(&self, cm: Option<&ConfigMap>, problems: &[ConfigProblem]) {
        let Some(cm) = cm else { return };
        for key in nodeslo_core::ConfigKey::ALL {
            if cm
                .data
                .as_ref()
                .is_some_and(|d| d.contains_key(key.data_key()))
            {
                let failed = problems
                    .iter()
                    .any(|p| matches!(p, ConfigProblem::Unmarshal { key: k, .. } if *k == key));
                self.metrics.parse(!failed, key.data_key());
            }
        }
        for problem in problems {
            tracing::warn!(configmap = %cm.name_any(), %problem, "invalid SLO config");
            if let ConfigProblem::InvalidSelector { .. } = problem {
                self.metrics.parse(false, problem.metric_reason());
            }
        }
    }

    /// Publishes one Warning Event per problem on the ConfigMap (the leading replica only, so a
    /// typo seen by N replicas is one Warning, not N).
    pub(crate) async fn publish_config_problems(
        &self,
        cm: Option<&ConfigMap>,
        problems: &[ConfigProblem],
    ) {
        let Some(cm) = cm else { return };
        for problem in problems {
            let event = Event::warning(
                problem.metric_reason(),
                "ParseSLOConfig",
                truncate(&problem.to_string(), 1000),
            );
            self.events
                .publish_or_log(&event, &cm.object_ref(&()))
                .await;
        }
    }

    pub(crate) async fn report_invalid_bandwidth(&self, node: &str, value: &str) {
        {
            let mut reported = lock(&self.reported_bandwidth);
            if reported.get(node).is_some_and(|v| v == value) {
                return;
            }
            reported.insert(node.to_string(), value.to_string());
        }
        let event = Event::warning(
            "InvalidNetworkBandwidth",
            "ComputeNodeSLO",
            format!(
                "annotation {}={value:?} is not a valid quantity; the SLO strategy's totalNetworkBandwidth is used",
                capstan_apis::slo::ANNOTATION_NETWORK_BANDWIDTH
            ),
        );
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..ObjectReference::default()
        };
        self.events.publish_or_log(&event, &reference).await;
    }
}
