//! One level-triggered pass for a node name: read the projections, decide with `nodeslo-core`,
//! make at most one write (create, guarded update, or delete of its NodeSLO).

use std::sync::Arc;
use std::time::Duration;

use capstan_apis::slo::{NodeSlo, NodeSloSpec};
use capstan_runtime::ErrorLabel;
use capstan_runtime::controller::{ReconcileFailure, Target};
use capstan_runtime::kube_errors::{is_conflict, is_failed_patch_test, is_not_found};
use capstan_runtime::sharding::ShardingError;
use capstan_runtime::sync::{read, write};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use nodeslo_core::decide::SpecShapeError;
use nodeslo_core::{Decision, decide};

use crate::controller::{NodeSloController, Sharded};
use crate::ownership::{Gate, ShardView, gate};
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
    #[error(transparent)]
    #[strum(serialize = "shard_release")]
    Release(#[from] ShardingError),
    #[error("reading Node {node}: {source}")]
    #[strum(serialize = "read_node")]
    ReadNode {
        node: String,
        #[source]
        source: kube::Error,
    },
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
        if let Some(sharded) = &self.sharded {
            let view = ShardView {
                slo: slo.as_ref().map(|entry| entry.draining),
                node: node.as_ref().map(|facts| {
                    sharded.node_labels
                        && facts
                            .labels
                            .contains_key(&sharded.member.ring().drain_label())
                }),
                nodes_sharded: sharded.node_labels,
                chosen: sharded.member.chooses_me(name),
            };
            let go_on = sharded.member.lease().is_active()
                && match gate(view) {
                    Gate::Reconcile => true,
                    Gate::ReleaseSlo => {
                        let slo = NodeSlo::new(name, NodeSloSpec::default());
                        return release(sharded, &slo).await;
                    }
                    Gate::ReleaseNode => {
                        let mut node = Node::default();
                        node.metadata.name = Some(name.to_owned());
                        return release(sharded, &node).await;
                    }
                    Gate::ConfirmNodeGone => !self.node_exists(name).await?,
                    Gate::Skip => false,
                };
            if !go_on {
                sharded.member.refused();
                return Ok(());
            }
        }
        let config = read(&self.config).current.clone();
        // Decide.
        let slo_facts = slo.map(|entry| entry.facts);
        let outcome = decide(node.as_ref(), slo_facts.as_ref(), &config)?;
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
                let mut slo = NodeSlo::new(name, spec);
                if let Some(sharded) = &self.sharded {
                    // Ours from the first write, so it lands in our label-selected watch.
                    slo.metadata.labels = Some(sharded.member.own_labels());
                }
                let result = api.create(&params, &slo).await;
                if let Ok(created) = &result {
                    self.remember_written(name, stamp, created);
                }
                if self.sharded.is_some()
                    && let Err(error) = &result
                    && is_conflict(error)
                {
                    // It exists on another shard (our view of the ring was stale, or a
                    // handover is under way); its label brings it to us if it is ours.
                    tracing::debug!(node = %name, "NodeSLO exists on another shard");
                    return Ok(());
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

    /// Whether the Node exists, read from the API server (`--shard-node-labels`: a Node not in
    /// our cache may be another shard's).
    async fn node_exists(&self, name: &str) -> Result<bool, ReconcileError> {
        let api: Api<Node> = Api::all(self.client.clone());
        match api.get_metadata_opt(name).await {
            Ok(found) => Ok(found.is_some()),
            Err(source) => Err(ReconcileError::ReadNode {
                node: name.to_owned(),
                source,
            }),
        }
    }

    /// Records what our own successful write left on the server, so that the watch event echoing
    /// it finds nothing new and costs no second reconcile; only if no watch event touched the
    /// name since the decision was read (then the projection is newer than our write).
    fn remember_written(&self, name: &str, stamp: Stamp, written: &NodeSlo) {
        let (_, facts) = project_slo(written.clone(), self.drain_label().as_deref());
        write(&self.slos).record_own_write(name, stamp, facts);
    }
}

/// Acknowledges the sharder's drain of a NodeSLO or Node (only its name is read); nothing else
/// is written for it.
async fn release<K>(sharded: &Sharded, object: &K) -> Result<(), ReconcileError>
where
    K: kube::Resource<DynamicType = ()>,
{
    let outcome = sharded.member.release(object).await?;
    tracing::debug!(name = ?object.meta().name, kind = %K::kind(&()), ?outcome, "released to the sharder");
    Ok(())
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
