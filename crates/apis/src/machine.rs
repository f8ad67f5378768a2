//! `machine.sapcloud.io/v1alpha1`: Gardener machine-controller-manager's MachineClass and Machine,
//! and (in [`sets`]) the MachineSet and MachineDeployment that own Machines.
//!
//! JSON names, finalizers, labels and phase strings are MCM's wire contract.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition, NodeSpec, SecretReference};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::duration::{DurationParseError, GoDuration};

pub mod sets;
use crate::wire::{preserve_unknown_object, wire_enum};
pub use sets::*;

/// API group.
pub const GROUP: &str = "machine.sapcloud.io";
/// API version.
pub const VERSION: &str = "v1alpha1";
/// Kind named by `spec.class.kind` for the classes this controller acts on.
pub const KIND_MACHINE_CLASS: &str = "MachineClass";

/// Finalizer on MachineClasses in use and on every managed Machine.
pub const FINALIZER_MCM: &str = "machine.sapcloud.io/machine-controller-manager";
/// Finalizer on Secrets referenced by a MachineClass.
pub const FINALIZER_SECRET: &str = "machine.sapcloud.io/machine-controller";
/// Finalizer on Nodes backing live Machines.
pub const FINALIZER_NODE: &str = "node.machine.sapcloud.io/machine-controller";

/// Machine label holding the name of its Node.
pub const LABEL_NODE: &str = "node";
/// Machine label naming its machine deployment (one failed machine per deployment at a time).
pub const LABEL_MACHINE_DEPLOYMENT: &str = "name";
/// Machine label that forces deletion without a graceful drain (value `"true"`).
pub const LABEL_FORCE_DELETION: &str = "force-deletion";
/// Node label naming the Machine that backs it.
pub const NODE_LABEL_MACHINE_NAME: &str = "node.gardener.cloud/machine-name";
/// Node annotation remembering the labels, annotations and taints last applied from the template.
pub const NODE_ANNOTATION_LAST_APPLIED: &str =
    "node.machine.sapcloud.io/last-applied-anno-labels-taints";

/// Node conditions that make a Node unhealthy when True, unless `spec.nodeConditions` says otherwise.
pub const DEFAULT_NODE_CONDITIONS: &str =
    "KernelDeadlock,ReadonlyFilesystem,DiskPressure,NetworkUnavailable";
/// Default `creationTimeout`.
pub const DEFAULT_CREATION_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// Default `healthTimeout`.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Default `drainTimeout`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(2 * 60 * 60);
/// Capacity keys a MachineClass node template must carry.
pub const REQUIRED_CAPACITY_KEYS: [&str; 3] = ["cpu", "gpu", "memory"];

/// A provider-specific machine template. MCM puts its fields at the top level of the object
/// (no `spec`): `#[kube(no_spec)]` flattens this struct onto the root, on the wire and in the schema.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "machine.sapcloud.io",
    version = "v1alpha1",
    kind = "MachineClass",
    doc = "A provider-specific machine template (MCM MachineClass); fields sit at the top level, there is no spec.",
    plural = "machineclasses",
    shortname = "mcc",
    printcolumn = r#"{"name":"Provider","type":"string","description":"Provider of the cloud-specific driver","jsonPath":".provider"}"#,
    printcolumn = r#"{"name":"Instance Type","type":"string","description":"Instance type of the machines of this class","jsonPath":".nodeTemplate.instanceType"}"#,
    printcolumn = r#"{"name":"Region","type":"string","description":"Region of the machines of this class","jsonPath":".nodeTemplate.region"}"#,
    printcolumn = r#"{"name":"Zone","type":"string","description":"Zone of the machines of this class","priority":1,"jsonPath":".nodeTemplate.zone"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    namespaced,
    no_spec,
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineClassSpec {
    /// Provider configuration, passed to the driver untouched.
    #[schemars(schema_with = "preserve_unknown_object")]
    pub provider_spec: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_template: Option<NodeTemplate>,
}

/// What a Node created from this class looks like (used by autoscalers and validated by the controller).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTemplate {
    /// Must hold `cpu`, `gpu` and `memory` (checked by the controller, as MCM does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_capacity: Option<BTreeMap<String, Quantity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
}

/// A VM managed through a provider driver.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "machine.sapcloud.io",
    version = "v1alpha1",
    kind = "Machine",
    doc = "A VM managed through a provider driver (MCM Machine).",
    plural = "machines",
    shortname = "mc",
    namespaced,
    status = "MachineStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Status","type":"string","description":"Current status of the machine.","jsonPath":".status.currentStatus.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","description":"CreationTimestamp is a timestamp representing the server time when this object was created.","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Node","type":"string","description":"Node backing the machine object","priority":1,"jsonPath":".metadata.labels.node"}"#,
    printcolumn = r#"{"name":"ProviderID","type":"string","description":"ProviderID of the infra instance backing the machine object","priority":1,"jsonPath":".spec.providerID"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<ClassSpec>,
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_template: Option<NodeTemplateSpec>,
    // MCM's MachineConfiguration, inlined into the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_timeout: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timeout: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_update_timeout: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_health_timeout: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_evict_retries: Option<i32>,
    /// Comma-separated Node condition types that make the Node unhealthy when True.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_conditions: Option<String>,
}

impl MachineSpec {
    /// `spec.nodeConditions` split on commas, or the default list.
    pub fn node_condition_types(&self) -> Vec<String> {
        self.node_conditions
            .as_deref()
            .unwrap_or(DEFAULT_NODE_CONDITIONS)
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// `creationTimeout`, or the default when unset.
    pub fn creation_timeout(&self) -> Result<Duration, DurationParseError> {
        timeout_or(self.creation_timeout.as_ref(), DEFAULT_CREATION_TIMEOUT)
    }

    /// `healthTimeout`, or the default when unset.
    pub fn health_timeout(&self) -> Result<Duration, DurationParseError> {
        timeout_or(self.health_timeout.as_ref(), DEFAULT_HEALTH_TIMEOUT)
    }

    /// `drainTimeout`, or the default when unset.
    pub fn drain_timeout(&self) -> Result<Duration, DurationParseError> {
        timeout_or(self.drain_timeout.as_ref(), DEFAULT_DRAIN_TIMEOUT)
    }
}

fn timeout_or(
    value: Option<&GoDuration>,
    default: Duration,
) -> Result<Duration, DurationParseError> {
    value.map_or(Ok(default), GoDuration::to_std)
}

/// Reference from a Machine to its class.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ClassSpec {
    /// The class name when this reference points at a `MachineClass`.
    pub fn machine_class_name(&self) -> Option<&str> {
        match (self.kind.as_deref(), self.name.as_deref()) {
            (Some(KIND_MACHINE_CLASS), Some(name)) if !name.is_empty() => Some(name),
            _ => None,
        }
    }
}

/// Labels, annotations and taints applied to the Machine's Node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct NodeTemplateSpec {
    /// Only `labels` and `annotations` are used; the rest is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub metadata: Option<ObjectMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpec>,
}

/// Observed state of a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Conditions copied from the Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<NodeCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_status: Option<CurrentStatus>,
    /// Opaque state owned by the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_known_state: Option<String>,
    /// Addresses reported by the driver on creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<NodeAddress>>,
}

/// The last operation the controller performed on a Machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastOperation {
    /// Human-readable step or error; the deletion flow records its step here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A [`Code`] name (`"ResourceExhausted"`); kept as a string because MCM writes free strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<MachineState>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<MachineOperationType>,
}

impl LastOperation {
    /// `errorCode` as a typed code, when it names one.
    pub fn code(&self) -> Option<Code> {
        self.error_code.as_deref().and_then(|s| s.parse().ok())
    }
}

/// The phase of a Machine and when it last changed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_active: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
}

wire_enum! {
    /// `status.currentStatus.phase`.
    pub enum MachinePhase {
        Pending => "Pending",
        Available => "Available",
        Running => "Running",
        Terminating => "Terminating",
        Unknown => "Unknown",
        Failed => "Failed",
        CrashLoopBackOff => "CrashLoopBackOff",
    }
}

impl MachinePhase {
    /// Value of the `mcm_machine_current_status_phase` gauge (MCM's numbering); `None` for
    /// phases MCM does not export.
    pub fn metric_value(&self) -> Option<i64> {
        Some(match self {
            Self::Terminating => -4,
            Self::Failed => -3,
            Self::CrashLoopBackOff => -2,
            Self::Unknown => -1,
            Self::Pending => 0,
            Self::Running => 1,
            Self::Available | Self::Other(_) => return None,
        })
    }
}

wire_enum! {
    /// `status.lastOperation.state`.
    pub enum MachineState {
        Processing => "Processing",
        Failed => "Failed",
        Successful => "Successful",
    }
}

wire_enum! {
    /// `status.lastOperation.type`.
    pub enum MachineOperationType {
        Create => "Create",
        Update => "Update",
        HealthCheck => "HealthCheck",
        Delete => "Delete",
        DrainNode => "DrainNode",
    }
}

/// MCM driver error codes: the gRPC codes plus `Uninitialized` (17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Code {
    Ok = 0,
    Canceled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
    /// The VM exists but `InitializeMachine` has not succeeded yet.
    Uninitialized = 17,
}

/// A string or number that is not an MCM error code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown machine error code {0:?}")]
pub struct UnknownCode(pub String);

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 18] = [
        Code::Ok,
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
        Code::Uninitialized,
    ];

    /// The numeric code (as on the gRPC wire).
    pub fn number(self) -> u32 {
        self as u32
    }

    /// The code for a number, if it is one.
    pub fn from_number(n: u32) -> Option<Code> {
        usize::try_from(n)
            .ok()
            .and_then(|i| Self::ALL.get(i))
            .copied()
    }

    /// The name MCM writes into `lastOperation.errorCode` (Go's `codes.Code.String()`).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::Canceled => "Canceled",
            Code::Unknown => "Unknown",
            Code::InvalidArgument => "InvalidArgument",
            Code::DeadlineExceeded => "DeadlineExceeded",
            Code::NotFound => "NotFound",
            Code::AlreadyExists => "AlreadyExists",
            Code::PermissionDenied => "PermissionDenied",
            Code::ResourceExhausted => "ResourceExhausted",
            Code::FailedPrecondition => "FailedPrecondition",
            Code::Aborted => "Aborted",
            Code::OutOfRange => "OutOfRange",
            Code::Unimplemented => "Unimplemented",
            Code::Internal => "Internal",
            Code::Unavailable => "Unavailable",
            Code::DataLoss => "DataLoss",
            Code::Unauthenticated => "Unauthenticated",
            Code::Uninitialized => "Uninitialized",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Code {
    type Err = UnknownCode;
    /// Accepts the name (`"NotFound"`) or Go's fallback form for numbers (`"Code(5)"`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(code) = Self::ALL.iter().find(|c| c.name() == s) {
            return Ok(*code);
        }
        s.strip_prefix("Code(")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|n| n.parse().ok())
            .and_then(Self::from_number)
            .ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

impl Machine {
    /// The Node name, from the `node` label.
    pub fn node_name(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_NODE))
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    /// The current phase, if any.
    pub fn phase(&self) -> Option<&MachinePhase> {
        self.status
            .as_ref()?
            .current_status
            .as_ref()?
            .phase
            .as_ref()
    }
}

impl MachineClass {
    /// Names of the Secrets this class references (`secretRef`, `credentialsSecretRef`).
    pub fn secret_refs(&self) -> impl Iterator<Item = &SecretReference> {
        self.spec
            .secret_ref
            .iter()
            .chain(self.spec.credentials_secret_ref.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn round_trip<T: serde::de::DeserializeOwned + Serialize>(input: Value) -> T {
        let typed: T = serde_json::from_value(input.clone()).expect("example decodes");
        let output = serde_json::to_value(&typed).expect("serialises");
        assert_eq!(output, input, "JSON changed on a round trip");
        typed
    }

    fn machine_class_json() -> Value {
        json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineClass",
            "metadata": {"name": "test-mc", "namespace": "default",
                         "finalizers": ["machine.sapcloud.io/machine-controller-manager"]},
            "providerSpec": {"image": "ubuntu", "simulate": {"createError": "ResourceExhausted"}, "n": [1, 2]},
            "provider": "simulated",
            "secretRef": {"name": "cloud", "namespace": "default"},
            "credentialsSecretRef": {"name": "creds", "namespace": "default"},
            "nodeTemplate": {
                "capacity": {"cpu": "2", "gpu": "0", "memory": "8Gi"},
                "virtualCapacity": {"hc.hana.com/memory": "1234567"},
                "instanceType": "m5.large", "region": "eu-west-1", "zone": "eu-west-1a",
                "architecture": "amd64"
            }
        })
    }

    #[test]
    fn machine_class_fields_sit_at_the_top_level() {
        let class: MachineClass = round_trip(machine_class_json());
        assert_eq!(class.spec.provider.as_deref(), Some("simulated"));
        assert_eq!(
            class.spec.provider_spec["simulate"]["createError"],
            "ResourceExhausted"
        );
        let names: Vec<_> = class
            .secret_refs()
            .filter_map(|r| r.name.as_deref())
            .collect();
        assert_eq!(names, ["cloud", "creds"]);
    }

    #[test]
    fn machine_round_trips_with_status() {
        let input = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": "m-1", "namespace": "default", "labels": {"node": "node-1", "name": "md-1"}},
            "spec": {
                "class": {"apiGroup": "machine.sapcloud.io", "kind": "MachineClass", "name": "test-mc"},
                "providerID": "sim:///eu/m-1",
                "nodeTemplate": {
                    "metadata": {"labels": {"role": "worker"}, "annotations": {"a": "b"}},
                    "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}
                },
                "creationTimeout": "20m", "healthTimeout": "10m", "drainTimeout": "2h",
                "disableHealthTimeout": false, "maxEvictRetries": 10,
                "nodeConditions": "KernelDeadlock,DiskPressure"
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "lastOperation": {"description": "Creating machine on cloud provider", "errorCode": "ResourceExhausted",
                                  "lastUpdateTime": "2026-11-29T10:00:00Z", "state": "Processing", "type": "Create"},
                "currentStatus": {"phase": "Pending", "timeoutActive": true, "lastUpdateTime": "2026-11-29T10:00:00Z"},
                "lastKnownState": "opaque",
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]
            }
        });
        let machine: Machine = round_trip(input);
        assert_eq!(machine.node_name(), Some("node-1"));
        assert_eq!(machine.phase(), Some(&MachinePhase::Pending));
        let spec = &machine.spec;
        assert_eq!(
            spec.class.as_ref().and_then(ClassSpec::machine_class_name),
            Some("test-mc")
        );
        assert_eq!(spec.creation_timeout(), Ok(Duration::from_secs(1200)));
        assert_eq!(spec.drain_timeout(), Ok(Duration::from_secs(7200)));
        assert_eq!(
            spec.node_condition_types(),
            ["KernelDeadlock", "DiskPressure"]
        );
        let op = machine
            .status
            .as_ref()
            .and_then(|s| s.last_operation.as_ref())
            .expect("has lastOperation");
        assert_eq!(op.code(), Some(Code::ResourceExhausted));
        assert_eq!(op.type_, Some(MachineOperationType::Create));
    }

    #[test]
    fn empty_machine_spec_uses_defaults() {
        let m: Machine = round_trip(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": "m"}, "spec": {}
        }));
        assert_eq!(m.spec.creation_timeout(), Ok(DEFAULT_CREATION_TIMEOUT));
        assert_eq!(m.spec.health_timeout(), Ok(DEFAULT_HEALTH_TIMEOUT));
        assert_eq!(m.spec.node_condition_types().len(), 4);
        assert_eq!(
            m.spec
                .class
                .as_ref()
                .and_then(ClassSpec::machine_class_name),
            None
        );
        assert!(m.status.is_none());
    }

    #[test]
    fn class_reference_to_another_kind_is_not_a_machine_class() {
        let c = ClassSpec {
            kind: Some("AWSMachineClass".into()),
            name: Some("x".into()),
            api_group: None,
        };
        assert_eq!(c.machine_class_name(), None);
    }

    #[test]
    fn phases_use_exact_strings_and_tolerate_unknown_ones() {
        let strings: Vec<_> = MachinePhase::KNOWN
            .iter()
            .map(MachinePhase::as_str)
            .collect();
        assert_eq!(
            strings,
            [
                "Pending",
                "Available",
                "Running",
                "Terminating",
                "Unknown",
                "Failed",
                "CrashLoopBackOff"
            ]
        );
        let p: MachinePhase = serde_json::from_value(json!("Migrating")).expect("lenient");
        assert_eq!(p, MachinePhase::Other("Migrating".into()));
        assert_eq!(MachinePhase::CrashLoopBackOff.metric_value(), Some(-2));
        assert_eq!(MachinePhase::Running.metric_value(), Some(1));
        assert_eq!(MachinePhase::Terminating.metric_value(), Some(-4));
        let states: Vec<_> = MachineState::KNOWN
            .iter()
            .map(MachineState::as_str)
            .collect();
        assert_eq!(states, ["Processing", "Failed", "Successful"]);
        assert_eq!(
            MachineOperationType::from("DrainNode"),
            MachineOperationType::DrainNode
        );
        assert_eq!(
            MachineOperationType::from("HealthCheck"),
            MachineOperationType::HealthCheck
        );
    }

    #[test]
    fn codes_have_grpc_numbers_and_names() {
        for (i, code) in Code::ALL.iter().enumerate() {
            assert_eq!(code.number() as usize, i);
            assert_eq!(Code::from_number(code.number()), Some(*code));
            assert_eq!(code.name().parse::<Code>(), Ok(*code));
        }
        assert_eq!(Code::Uninitialized.number(), 17);
        assert_eq!(Code::ResourceExhausted.number(), 8);
        assert_eq!(Code::Ok.to_string(), "OK");
        assert_eq!(Code::from_number(18), None);
        assert_eq!("Code(14)".parse::<Code>(), Ok(Code::Unavailable));
        assert_eq!(
            "resourceexhausted".parse::<Code>(),
            Err(UnknownCode("resourceexhausted".into()))
        );
    }
}
