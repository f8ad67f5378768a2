//! One level-triggered pass for a node name: read the projections, decide with `nodeslo-core`,
//! make at most one write (create, guarded update, or delete of its NodeSLO).

use std::sync::Arc;
use std::time::Duration;

use capstan_apis::slo::{NodeSlo, NodeSloSpec};
use capstan_runtime::ErrorLabel;
use capstan_runtime::controller::{ReconcileFailure, Target};
use capstan_runtime::kube_errors::{is_conflict, is_failed_patch_test, is_not_found};
use capstan_runtime::sync::{read, write};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use nodeslo_core::decide::SpecShapeError;
use nodeslo_core::{Decision, decide};

use crate::controller::NodeSloController;
use crate::projection::Stamp;
use crate::watch::project_slo;

/// The object kind in the runtime's reconcile metrics and spans.
pub const KIND: &str = "NodeSLO";

/// Why one reconcile failed; the label feeds metrics, spans and logs.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ReconcileError {
    #[error("creating NodeSLO {node}: {source}")]
    #[strum(serialize = "create_nodeslo")]
    Create {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating NodeSLO {node}: {source}")]
    #[strum(serialize = "update_nodeslo")]
    Update {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting NodeSLO {node}: {source}")]
    #[strum(serialize = "delete_nodeslo")]
    Delete {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    #[strum(serialize = "spec_shape")]
    Shape(#[from] SpecShapeError),
}

/// The label is each variant's `strum(serialize)` above (`strum::IntoStaticStr`).
impl ErrorLabel for ReconcileError {
    fn metric_label(&self) -> &'static str {
        self.into()
    }
}

impl ReconcileFailure for ReconcileError {
    /// Stale cache: a create of an existing name (409), or a failed resourceVersion test of an
    /// update (409, or 422 for the failed JSON patch `test`).
    fn is_conflict(&self) -> bool {
        match self {
            ReconcileError::Create { source, .. } => is_conflict(source),
            ReconcileError::Update { source, .. } => {
                is_conflict(source) || is_failed_patch_test(source)
            }
            _ => false,
        }
    }
}

impl NodeSloController {
    /// One pass for `name`; returns when to look again (`None`: on the next change).
    pub(crate) async fn reconcile(self: Arc<Self>, name: String) -> Option<Duration> {
        let target = Target::new(KIND, None, &name);
        // The kit boxes the pass (a 13 KiB state machine) before it is moved anywhere.
        let result = self
            .reconciler
            .reconcile(target, self.reconcile_node(&name))
            .await;
        result
            .err()
            .map(|error| self.reconciler.retry_after(target, &error))
    }

    async fn reconcile_node(&self, name: &str) -> Result<(), ReconcileError> {
        // Read.
        let node = read(&self.nodes).get(name).cloned();
        let (slo, stamp) = {
            let slos = read(&self.slos);
            (slos.get(name).cloned(), slos.stamp(name))
        };
        let config = read(&self.config).current.clone();
        // Decide.
        let outcome = decide(node.as_ref(), slo.as_ref(), &config)?;
        if let Some(value) = &outcome.invalid_bandwidth {
            self.report_invalid_bandwidth(name, value).await;
        }
        // Apply.
        self.write(name, stamp, outcome.decision).await
    }

    async fn write(
        &self,
        name: &str,
        stamp: Stamp,
        decision: Decision,
    ) -> Result<(), ReconcileError> {
        let api: Api<NodeSlo> = Api::all(self.client.clone());
        let node = || name.to_owned();
        // The reasons are Koordinator's metric labels, kept as the reference spells them.
        let (reason, result) = match decision {
            Decision::Nothing => return Ok(()),
            Decision::Create(spec) => {
                let params = PostParams {
                    field_manager: Some(self.settings.manager.clone()),
                    ..PostParams::default()
                };
                let result = api.create(&params, &NodeSlo::new(name, spec)).await;
                if let Ok(created) = &result {
                    self.remember_written(name, stamp, created);
                }
                let result = result.map(drop).map_err(|source| ReconcileError::Create {
                    node: node(),
                    source,
                });
                ("createNodeSLO", result)
            }
            Decision::Update {
                spec,
                resource_version,
            } => {
                let patch = replace_spec_patch(&spec, resource_version.as_deref())?;
                let params = PatchParams {
                    field_manager: Some(self.settings.manager.clone()),
                    ..PatchParams::default()
                };
                let result = api.patch(name, &params, &Patch::Json::<()>(patch)).await;
                if let Ok(updated) = &result {
                    self.remember_written(name, stamp, updated);
                }
                let result = result.map(drop).map_err(|source| ReconcileError::Update {
                    node: node(),
                    source,
                });
                ("updateNodeSLO", result)
            }
            Decision::Delete => {
                let result = match api.delete(name, &DeleteParams::default()).await {
                    Err(error) if is_not_found(&error) => Ok(()),
                    other => other.map(drop),
                };
                let result = result.map_err(|source| ReconcileError::Delete {
                    node: node(),
                    source,
                });
                ("deleteNodeSLO", result)
            }
        };
        self.metrics.write(result.is_ok(), reason);
        if result.is_ok() {
            tracing::debug!(node = %name, action = reason, "NodeSLO written");
        }
        result
    }

    /// Records what our own successful write left on the server, so that the watch event echoing
    /// it finds nothing new and costs no second reconcile; only if no watch event touched the
    /// name since the decision was read (then the projection is newer than our write).
    fn remember_written(&self, name: &str, stamp: Stamp, written: &NodeSlo) {
        let (_, facts) = project_slo(written.clone());
        write(&self.slos).record_own_write(name, stamp, facts);
    }
}

/// A JSON patch that replaces the whole spec (so removed fields go too) only if the NodeSLO is
/// still at the version the decision was made from.
fn replace_spec_patch(
    spec: &NodeSloSpec,
    resource_version: Option<&str>,
) -> Result<json_patch::Patch, ReconcileError> {
    let mut ops = Vec::new();
    if let Some(rv) = resource_version {
        ops.push(
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
        );
    }
    let spec = serde_json::to_value(spec).map_err(SpecShapeError::from)?;
    ops.push(serde_json::json!({"op": "add", "path": "/spec", "value": spec}));
    serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| ReconcileError::Shape(SpecShapeError::from(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("message", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn update_patch_tests_the_version_then_replaces_the_spec() {
        let patch = replace_spec_patch(&NodeSloSpec::default(), Some("7")).expect("patch");
        assert_eq!(
            serde_json::to_value(&patch).expect("json"),
            serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/spec", "value": {}}
            ])
        );
    }

    #[test]
    fn error_labels_are_snake_case_and_stale_writes_are_conflicts() {
        let create = ReconcileError::Create {
            node: "n1".into(),
            source: api(409),
        };
        // kube-apiserver's answer to a JSON patch whose resourceVersion `test` failed.
        let failed_test: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 422, "reason": "Invalid",
            "message": "the server rejected our request due to an error in our request",
            "details": {"causes": [{"reason": "UnexpectedServerResponse",
                "message": "testing value /metadata/resourceVersion failed: test failed"}]},
        }))
        .expect("a Status");
        let update = ReconcileError::Update {
            node: "n1".into(),
            source: kube::Error::Api(failed_test.boxed()),
        };
        let delete = ReconcileError::Delete {
            node: "n1".into(),
            source: api(409),
        };
        assert_eq!(create.metric_label(), "create_nodeslo");
        assert_eq!(update.metric_label(), "update_nodeslo");
        assert_eq!(delete.metric_label(), "delete_nodeslo");
        assert!(create.is_conflict() && update.is_conflict());
        assert!(!delete.is_conflict(), "a delete has no stale-cache retry");
        let server_error = ReconcileError::Update {
            node: "n1".into(),
            source: api(500),
        };
        assert!(!server_error.is_conflict());
        let invalid = ReconcileError::Update {
            node: "n1".into(),
            source: api(422),
        };
        assert!(
            !invalid.is_conflict(),
            "a 422 naming no failed test is not a stale cache"
        );
    }
}
