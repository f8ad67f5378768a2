//! Decisions of the Machine creation flow and of the health check that the controller used to
//! make inline: whether to adopt an existing VM or create one, whether the VM's Node belongs to
//! another Machine, whether Node conditions changed in a way worth writing, and whether another
//! Machine of the same MachineDeployment already failed (MCM then defers replacing this one).

use capstan_apis::machine::{Code, LABEL_MACHINE_DEPLOYMENT, Machine, MachinePhase};
use k8s_openapi::api::core::v1::NodeCondition;

/// What the creation flow does after asking the provider for the Machine's VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmLookup {
    /// The VM exists (for example created before a restart): adopt it, never create twice.
    Adopt,
    /// The provider has no such VM (`NotFound`) or cannot tell (`Unimplemented`): create it.
    Create,
    /// Any other error fails this creation attempt.
    Fail,
}

/// Maps the `GetMachineStatus` outcome (`None`: success, else the error code) to the next step.
pub fn after_status_lookup(error: Option<Code>) -> VmLookup {
    match error {
        None => VmLookup::Adopt,
        Some(Code::NotFound | Code::Unimplemented) => VmLookup::Create,
        Some(_) => VmLookup::Fail,
    }
}

/// A Node of the VM's name labelled for another Machine: this VM must not take it over (MCM
/// deletes the VM and fails the Machine: "VM using old node obj").
pub fn node_owned_by_another(node_owner: Option<&str>, machine: &str) -> bool {
    node_owner.is_some_and(|owner| owner != machine)
}

/// Whether two condition lists say the same to a reader: type, status, reason and message in
/// order. Heartbeat and transition times change constantly and are ignored, so a Machine's
/// status is not rewritten on every kubelet heartbeat.
pub fn same_conditions(a: &[NodeCondition], b: &[NodeCondition]) -> bool {
    let key = |c: &NodeCondition| {
        (
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
        )
    };
    a.len() == b.len() && a.iter().map(key).eq(b.iter().map(key))
}

/// Whether a Machine other than `machine` in the same MachineDeployment is `Failed`.
pub fn another_failed_in_deployment<'a>(
    machine: &Machine,
    machines: impl IntoIterator<Item = &'a Machine>,
) -> bool {
    let labels = machine.metadata.labels.as_ref();
    let Some(deployment) = labels.and_then(|l| l.get(LABEL_MACHINE_DEPLOYMENT)) else {
        return false;
    };
    machines.into_iter().any(|other| {
        other.metadata.name != machine.metadata.name
            && other
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_MACHINE_DEPLOYMENT))
                == Some(deployment)
            && other.phase() == Some(&MachinePhase::Failed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(name: &str, deployment: Option<&str>, phase: Option<&str>) -> Machine {
        let mut value = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": name, "namespace": "default"}, "spec": {}
        });
        if let Some(deployment) = deployment {
            value["metadata"]["labels"] = json!({ LABEL_MACHINE_DEPLOYMENT: deployment });
        }
        if let Some(phase) = phase {
            value["status"] = json!({"currentStatus": {"phase": phase}});
        }
        serde_json::from_value(value).expect("machine")
    }

    fn condition(type_: &str, status: &str, heartbeat: i64) -> NodeCondition {
        serde_json::from_value(json!({
            "type": type_, "status": status, "reason": "KubeletReady", "message": "ok",
            "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::from_second(heartbeat).expect("time").to_string(),
        }))
        .expect("condition")
    }

    #[test]
    fn an_existing_vm_is_adopted_a_missing_one_created_other_errors_fail() {
        assert_eq!(after_status_lookup(None), VmLookup::Adopt);
        assert_eq!(after_status_lookup(Some(Code::NotFound)), VmLookup::Create);
        assert_eq!(
            after_status_lookup(Some(Code::Unimplemented)),
            VmLookup::Create
        );
        assert_eq!(after_status_lookup(Some(Code::Unavailable)), VmLookup::Fail);
        assert_eq!(after_status_lookup(Some(Code::Internal)), VmLookup::Fail);
    }

    #[test]
    fn a_node_labelled_for_another_machine_collides() {
        assert!(node_owned_by_another(Some("old-machine"), "m-1"));
        assert!(!node_owned_by_another(Some("m-1"), "m-1"));
        assert!(
            !node_owned_by_another(None, "m-1"),
            "an unlabelled node is taken over"
        );
    }

    #[test]
    fn heartbeats_alone_do_not_change_conditions() {
        let before = [condition("Ready", "True", 10)];
        assert!(same_conditions(&before, &[condition("Ready", "True", 99)]));
        assert!(!same_conditions(
            &before,
            &[condition("Ready", "False", 10)]
        ));
        assert!(!same_conditions(&before, &[]));
        assert!(!same_conditions(
            &before,
            &[
                condition("Ready", "True", 10),
                condition("DiskPressure", "False", 10)
            ]
        ));
    }

    #[test]
    fn only_a_failed_sibling_of_the_same_deployment_counts() {
        let me = machine("m-1", Some("d"), Some("Unknown"));
        let failed_sibling = machine("m-2", Some("d"), Some("Failed"));
        let running_sibling = machine("m-3", Some("d"), Some("Running"));
        let failed_stranger = machine("m-4", Some("other"), Some("Failed"));
        assert!(another_failed_in_deployment(&me, [&me, &failed_sibling]));
        assert!(!another_failed_in_deployment(
            &me,
            [&me, &running_sibling, &failed_stranger]
        ));
        let failed_me = machine("m-1", Some("d"), Some("Failed"));
        assert!(
            !another_failed_in_deployment(&me, [&failed_me]),
            "the machine itself does not count"
        );
        let lone = machine("m-5", None, Some("Unknown"));
        assert!(!another_failed_in_deployment(&lone, [&failed_sibling]));
    }
}
