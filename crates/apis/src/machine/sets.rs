//! MCM's MachineSet and MachineDeployment (`machine.sapcloud.io/v1alpha1`): the objects Gardener's
//! worker pools create. A MachineDeployment owns MachineSets (one per template revision), a
//! MachineSet owns Machines. Field names, short names (`mcd`, `mcs`), printer columns, the scale
//! subresource and the label and annotation keys are MCM's (`docs/machineset.md`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ClassSpec, LastOperation, MachineSpec};
use crate::wire::{preserve_unknown_object, wire_enum};

/// Label a MachineDeployment adds to its MachineSets' selectors, templates and Machines: the hash
/// of the template that set was made from, so sets of different revisions never select each
/// other's Machines.
pub const LABEL_TEMPLATE_HASH: &str = "machine-template-hash";
/// MachineSet (and MachineDeployment) annotation: the revision this set's template is.
pub const ANNOTATION_REVISION: &str = "deployment.kubernetes.io/revision";
/// MachineSet annotation: earlier revisions this same template was (comma separated).
pub const ANNOTATION_REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// MachineSet annotation: the deployment's `spec.replicas` when the set was last scaled.
pub const ANNOTATION_DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// MachineSet annotation: the deployment's replicas plus its max surge when last scaled.
pub const ANNOTATION_MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// Machine annotation ordering scale-down: lower goes first. The cluster-autoscaler writes `"1"`
/// on the Machine it wants removed before it lowers the replicas; unset counts as
/// [`DEFAULT_MACHINE_PRIORITY`].
pub const ANNOTATION_MACHINE_PRIORITY: &str = "machinepriority.machine.sapcloud.io";
/// A Machine's priority when it has no (or an unparsable) priority annotation.
pub const DEFAULT_MACHINE_PRIORITY: i32 = 3;

/// A desired number of Machines made from one template (MCM MachineSet).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "machine.sapcloud.io",
    version = "v1alpha1",
    kind = "MachineSet",
    doc = "A desired number of Machines made from one template (MCM MachineSet).",
    plural = "machinesets",
    shortname = "mcs",
    namespaced,
    status = "MachineSetStatus",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas"}"#,
    derive = "PartialEq",
    printcolumn = r#"{"name":"Desired","type":"integer","description":"Number of desired replicas.","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Current","type":"integer","description":"Number of actual replicas.","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","description":"Number of ready replicas for this machine set.","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","description":"CreationTimestamp is a timestamp representing the server time when this object was created.","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_class: Option<ClassSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<MachineTemplateSpec>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_ready_seconds: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_max: Option<i32>,
}

/// Observed state of a MachineSet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    /// Machines the set owns that are not being deleted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,
    /// Of those, the ones whose labels hold every template label.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fully_labeled_replicas: i32,
    /// Of those, the Running ones.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ready_replicas: i32,
    /// Of those, the ones Running for at least `minReadySeconds`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub available_replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_generation: i64,
    /// MCM's JSON name for the conditions of a set (not `conditions`).
    #[serde(
        rename = "machineSetCondition",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub conditions: Option<Vec<MachineSetCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// The Machines whose last operation failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_machines: Option<Vec<MachineSummary>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_count: Option<i32>,
}

/// The template Machines of a set are made from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct MachineTemplateSpec {
    /// Labels and annotations copied onto each Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub metadata: Option<ObjectMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<MachineSpec>,
}

impl MachineTemplateSpec {
    /// The template's labels (empty when it has none).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }
}

/// One failed Machine, as a set or deployment reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// Name of the Machine's controlling owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_ref: Option<String>,
}

wire_enum! {
    /// `status` of a set's or deployment's condition.
    pub enum ConditionStatus {
        True => "True",
        False => "False",
        Unknown => "Unknown",
    }
}

wire_enum! {
    /// `type` of a MachineSet condition.
    pub enum MachineSetConditionType {
        /// A Machine could not be created or deleted.
        ReplicaFailure => "ReplicaFailure",
        /// The safety controller froze the set for overshooting its replicas.
        Frozen => "Frozen",
    }
}

/// A MachineSet condition (`status.machineSetCondition[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetCondition {
    #[serde(rename = "type")]
    pub type_: MachineSetConditionType,
    pub status: ConditionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Declarative updates of Machines through MachineSets (MCM MachineDeployment).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "machine.sapcloud.io",
    version = "v1alpha1",
    kind = "MachineDeployment",
    doc = "Declarative updates of Machines through MachineSets (MCM MachineDeployment).",
    plural = "machinedeployments",
    shortname = "mcd",
    namespaced,
    status = "MachineDeploymentStatus",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas"}"#,
    derive = "PartialEq",
    printcolumn = r#"{"name":"Ready","type":"integer","description":"Total number of ready machines targeted by this machine deployment.","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","description":"Number of desired machines.","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Up-to-date","type":"integer","description":"Total number of non-terminated machines targeted by this machine deployment that have the desired template spec.","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","description":"Total number of available machines (ready for at least minReadySeconds) targeted by this machine deployment.","jsonPath":".status.availableReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","description":"CreationTimestamp is a timestamp representing the server time when this object was created.","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    pub template: MachineTemplateSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MachineDeploymentStrategy>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_ready_seconds: i32,
    /// Old MachineSets kept for rollback; unset means MCM's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Deprecated in MCM; kept so objects round-trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<RollbackConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<i32>,
}

/// How a deployment replaces Machines.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStrategy {
    /// `RollingUpdate` (the default) or `Recreate`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<StrategyType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdateMachineDeployment>,
}

wire_enum! {
    /// `spec.strategy.type`.
    pub enum StrategyType {
        /// Delete every old Machine before creating new ones.
        Recreate => "Recreate",
        /// Scale the new set up and the old ones down within maxSurge and maxUnavailable.
        RollingUpdate => "RollingUpdate",
    }
}

/// Bounds of a rolling update: absolute numbers or percents of `spec.replicas`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateMachineDeployment {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
}

/// The revision a deprecated rollback goes to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct RollbackConfig {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub revision: i64,
}

/// Observed state of a MachineDeployment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStatus {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_generation: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub updated_replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ready_replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub available_replicas: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unavailable_replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<MachineDeploymentCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_machines: Option<Vec<MachineSummary>>,
}

wire_enum! {
    /// `type` of a MachineDeployment condition.
    pub enum MachineDeploymentConditionType {
        /// At least `replicas - maxUnavailable` Machines are available.
        Available => "Available",
        /// The rollout is moving, done, or past its progress deadline (see the reason).
        Progressing => "Progressing",
        /// A Machine could not be created or deleted.
        ReplicaFailure => "ReplicaFailure",
        /// The safety controller froze the deployment for overshooting its replicas.
        Frozen => "Frozen",
    }
}

/// A MachineDeployment condition (`status.conditions[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentCondition {
    #[serde(rename = "type")]
    pub type_: MachineDeploymentConditionType,
    pub status: ConditionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

// Go's `omitempty` on a number: zero is not written.
fn is_zero<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn round_trip<T: serde::de::DeserializeOwned + Serialize>(input: &Value) -> T {
        let typed: T = serde_json::from_value(input.clone()).expect("decodes");
        let back = serde_json::to_value(&typed).expect("encodes");
        assert_eq!(&back, input, "round trip changes nothing");
        typed
    }

    #[test]
    fn a_machine_set_as_mcm_writes_it_round_trips() {
        let set: MachineSet = round_trip(&json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineSet",
            "metadata": {"name": "pool-a-5d8f7", "namespace": "shoot--p--s",
                         "annotations": {"deployment.kubernetes.io/revision": "2"}},
            "spec": {
                "replicas": 3,
                "minReadySeconds": 5,
                "selector": {"matchLabels": {"name": "pool-a", "machine-template-hash": "5d8f7"}},
                "machineClass": {"kind": "MachineClass", "name": "pool-a-c1"},
                "template": {
                    "metadata": {"labels": {"name": "pool-a", "machine-template-hash": "5d8f7"}},
                    "spec": {"class": {"kind": "MachineClass", "name": "pool-a-c1"}}
                }
            },
            "status": {
                "replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 2,
                "availableReplicas": 2, "observedGeneration": 4,
                "machineSetCondition": [{"type": "Frozen", "status": "True", "reason": "OverShootingReplicaCount"}],
                "failedMachines": [{"name": "m1", "providerID": "sim://m1", "ownerRef": "pool-a-5d8f7",
                                    "lastOperation": {"state": "Failed", "type": "Create"}}]
            }
        }));
        assert_eq!(set.spec.replicas, 3);
        let status = set.status.expect("status");
        let conditions = status.conditions.expect("conditions");
        assert_eq!(conditions[0].type_, MachineSetConditionType::Frozen);
        assert_eq!(conditions[0].status, ConditionStatus::True);
    }

    #[test]
    fn a_machine_deployment_with_percent_bounds_round_trips() {
        let deployment: MachineDeployment = round_trip(&json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineDeployment",
            "metadata": {"name": "pool-a", "namespace": "shoot--p--s"},
            "spec": {
                "replicas": 10,
                "selector": {"matchLabels": {"name": "pool-a"}},
                "strategy": {"type": "RollingUpdate",
                             "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
                "revisionHistoryLimit": 2,
                "progressDeadlineSeconds": 600,
                "paused": true,
                "template": {"metadata": {"labels": {"name": "pool-a"}},
                             "spec": {"class": {"kind": "MachineClass", "name": "c1"}}}
            },
            "status": {"replicas": 10, "updatedReplicas": 4, "unavailableReplicas": 1,
                       "conditions": [{"type": "Progressing", "status": "True",
                                       "reason": "MachineSetUpdated"}]}
        }));
        let strategy = deployment.spec.strategy.expect("strategy");
        assert_eq!(strategy.type_, Some(StrategyType::RollingUpdate));
        let bounds = strategy.rolling_update.expect("bounds");
        assert_eq!(bounds.max_surge, Some(IntOrString::String("25%".into())));
        assert_eq!(bounds.max_unavailable, Some(IntOrString::Int(0)));
    }

    #[test]
    fn zero_replicas_are_left_out_as_go_omits_them() {
        let spec = MachineSetSpec::default();
        assert_eq!(serde_json::to_value(&spec).expect("encodes"), json!({}));
    }
}
