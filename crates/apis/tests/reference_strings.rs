//! The wire names the specs give (`shared/spec/machineclass.md`, `nodeslo.md`, `gw-recycler.md`),
//! pinned as literals: the types and constants of this crate are checked against the reference,
//! so a typo in a constant fails here even when every test that uses the constant agrees with it.

use capstan_apis::machine::{self, Code, MachineOperationType, MachinePhase, MachineState};
use capstan_apis::slo;

#[test]
fn machine_phases_states_and_operation_types_are_mcms() {
    let phases: Vec<&str> = [
        MachinePhase::Pending,
        MachinePhase::Available,
        MachinePhase::Running,
        MachinePhase::Terminating,
        MachinePhase::Unknown,
        MachinePhase::Failed,
        MachinePhase::CrashLoopBackOff,
    ]
    .iter()
    .map(|phase| phase.as_str())
    .collect::<Vec<_>>();
    assert_eq!(
        phases,
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
    let states: Vec<&str> = [
        MachineState::Processing,
        MachineState::Failed,
        MachineState::Successful,
    ]
    .iter()
    .map(|state| state.as_str())
    .collect::<Vec<_>>();
    assert_eq!(states, ["Processing", "Failed", "Successful"]);
    let types: Vec<&str> = [
        MachineOperationType::Create,
        MachineOperationType::Delete,
        MachineOperationType::HealthCheck,
        MachineOperationType::DrainNode,
    ]
    .iter()
    .map(|op| op.as_str())
    .collect::<Vec<_>>();
    assert_eq!(types, ["Create", "Delete", "HealthCheck", "DrainNode"]);
}

#[test]
fn machine_finalizers_labels_and_annotations_are_mcms() {
    assert_eq!(machine::GROUP, "machine.sapcloud.io");
    assert_eq!(machine::VERSION, "v1alpha1");
    assert_eq!(machine::KIND_MACHINE_CLASS, "MachineClass");
    assert_eq!(
        machine::FINALIZER_MCM,
        "machine.sapcloud.io/machine-controller-manager"
    );
    assert_eq!(
        machine::FINALIZER_SECRET,
        "machine.sapcloud.io/machine-controller"
    );
    assert_eq!(
        machine::FINALIZER_NODE,
        "node.machine.sapcloud.io/machine-controller"
    );
    assert_eq!(machine::LABEL_NODE, "node");
    assert_eq!(machine::LABEL_MACHINE_DEPLOYMENT, "name");
    assert_eq!(machine::LABEL_FORCE_DELETION, "force-deletion");
    assert_eq!(
        machine::NODE_LABEL_MACHINE_NAME,
        "node.gardener.cloud/machine-name"
    );
    assert_eq!(
        machine::NODE_ANNOTATION_LAST_APPLIED,
        "node.machine.sapcloud.io/last-applied-anno-labels-taints"
    );
    assert_eq!(
        machine::DEFAULT_NODE_CONDITIONS,
        "KernelDeadlock,ReadonlyFilesystem,DiskPressure,NetworkUnavailable"
    );
}

#[test]
fn driver_codes_are_grpcs_plus_uninitialized() {
    assert_eq!(Code::ResourceExhausted.name(), "ResourceExhausted");
    assert_eq!(Code::Unavailable.name(), "Unavailable");
    assert_eq!(Code::Uninitialized.name(), "Uninitialized");
    assert_eq!(Code::Uninitialized as u32, 17);
}

#[test]
fn nodeslo_names_are_koordinators() {
    assert_eq!(slo::GROUP, "slo.koordinator.sh");
    assert_eq!(slo::VERSION, "v1alpha1");
    assert_eq!(slo::CONFIG_NAMESPACE, "koordinator-system");
    assert_eq!(slo::CONFIG_NAME, "slo-controller-config");
    assert_eq!(
        slo::CONFIG_KEY_RESOURCE_THRESHOLD,
        "resource-threshold-config"
    );
    assert_eq!(slo::CONFIG_KEY_RESOURCE_QOS, "resource-qos-config");
    assert_eq!(slo::CONFIG_KEY_CPU_BURST, "cpu-burst-config");
    assert_eq!(slo::CONFIG_KEY_SYSTEM, "system-config");
    assert_eq!(slo::CONFIG_KEY_HOST_APPLICATION, "host-application-config");
    assert_eq!(
        slo::EVENT_REASON_CONFIG_UNMARSHAL_FAILED,
        "SLOCfgUnmarshalFailed"
    );
    assert_eq!(
        slo::ANNOTATION_NETWORK_BANDWIDTH,
        "node.koordinator.sh/network-bandwidth"
    );
}

#[test]
fn recycler_event_reasons_are_kubeslices() {
    use capstan_apis::worker;
    assert_eq!(worker::EVENT_FSM_NEW_GW_SPAWNED, "FSMNewGWSpawned");
    assert_eq!(
        worker::EVENT_FSM_ROUTING_TABLE_UPDATED,
        "FSMRoutingTableUpdated"
    );
    assert_eq!(worker::EVENT_FSM_DELETE_OLD_GW, "FSMDeleteOldGW");
}
