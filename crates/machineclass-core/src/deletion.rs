//! The resumable Machine deletion flow (MCM's `triggerDeletionFlow`). The step to run next is
//! read back from `status.lastOperation.description` (MCM's step markers), so a restarted
//! controller continues where the previous one stopped.

use std::time::Duration;

use capstan_apis::machine::{
    LABEL_FORCE_DELETION, Machine, MachineOperationType, MachinePhase, MachineState,
};
use k8s_openapi::api::core::v1::Pod;

use crate::Timestamp;
use crate::driver_error::elapsed;
use crate::status::{Operation, StatusChange};

/// MCM's step markers, matched as substrings of `lastOperation.description`.
pub const GET_VM_STATUS: &str = "Set machine status to termination. Now, getting VM Status";
pub const INITIATE_DRAIN: &str = "Initiate node drain";
pub const DELETE_VOLUME_ATTACHMENTS: &str = "Delete Volume Attachments";
pub const INITIATE_VM_DELETION: &str = "Initiate VM deletion";
pub const INITIATE_NODE_DELETION: &str = "Initiate node deletion";
pub const INITIATE_FINALIZER_REMOVAL: &str = "Initiate machine object finalizer removal";

/// A step of the deletion flow, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeletionStep {
    /// Set phase Terminating (records [`GET_VM_STATUS`]).
    SetTerminating,
    /// Look the VM up and find the node name.
    GetVmStatus,
    /// Cordon and evict.
    Drain,
    /// Delete the Node's VolumeAttachments.
    DeleteVolumeAttachments,
    /// `DeleteMachine` through the driver.
    DeleteVm,
    /// Delete the Node object (removing its finalizer).
    DeleteNode,
    /// Remove the Machine finalizer.
    RemoveFinalizer,
}

impl DeletionStep {
    /// The marker recorded once this step is the next one to run.
    pub fn marker(self) -> &'static str {
        match self {
            Self::SetTerminating | Self::GetVmStatus => GET_VM_STATUS,
            Self::Drain => INITIATE_DRAIN,
            Self::DeleteVolumeAttachments => DELETE_VOLUME_ATTACHMENTS,
            Self::DeleteVm => INITIATE_VM_DELETION,
            Self::DeleteNode => INITIATE_NODE_DELETION,
            Self::RemoveFinalizer => INITIATE_FINALIZER_REMOVAL,
        }
    }

    /// The step after this one (`None` after the last).
    pub fn next(self) -> Option<Self> {
        Some(match self {
            Self::SetTerminating => Self::GetVmStatus,
            Self::GetVmStatus => Self::Drain,
            Self::Drain => Self::DeleteVolumeAttachments,
            Self::DeleteVolumeAttachments => Self::DeleteVm,
            Self::DeleteVm => Self::DeleteNode,
            Self::DeleteNode => Self::RemoveFinalizer,
            Self::RemoveFinalizer => return None,
        })
    }

    /// Short stable label (logs, metrics).
    pub fn label(self) -> &'static str {
        match self {
            Self::SetTerminating => "set_terminating",
            Self::GetVmStatus => "get_vm_status",
            Self::Drain => "drain",
            Self::DeleteVolumeAttachments => "delete_volume_attachments",
            Self::DeleteVm => "delete_vm",
            Self::DeleteNode => "delete_node",
            Self::RemoveFinalizer => "remove_finalizer",
        }
    }
}

/// The step to run for a deleting Machine, from its recorded status.
pub fn current_step(machine: &Machine) -> DeletionStep {
    if machine.phase() != Some(&MachinePhase::Terminating) {
        return DeletionStep::SetTerminating;
    }
    let description = machine
        .status
        .as_ref()
        .and_then(|s| s.last_operation.as_ref())
        .and_then(|op| op.description.as_deref())
        .unwrap_or_default();
    // Most advanced first, so a description that mentions a step and its predecessor resumes late.
    [
        DeletionStep::RemoveFinalizer,
        DeletionStep::DeleteNode,
        DeletionStep::DeleteVm,
        DeletionStep::DeleteVolumeAttachments,
        DeletionStep::Drain,
    ]
    .into_iter()
    .find(|step| description.contains(step.marker()))
    .unwrap_or(DeletionStep::GetVmStatus)
}

/// The status recording that `step` is the next one to run (`prefix` says what just happened).
pub fn record_step(step: DeletionStep, prefix: Option<&str>) -> StatusChange {
    let description = match prefix {
        Some(p) => format!("{p}. {}", step.marker()),
        None => step.marker().to_owned(),
    };
    let kind = if step == DeletionStep::Drain {
        MachineOperationType::DrainNode
    } else {
        MachineOperationType::Delete
    };
    StatusChange::phase(MachinePhase::Terminating).with_operation(Operation::new(
        description,
        MachineState::Processing,
        kind,
    ))
}

/// The status recording that `step` failed and will be retried (its marker stays, so the flow
/// resumes at the same step).
pub fn record_step_failure(step: DeletionStep, message: &str, code: Option<&str>) -> StatusChange {
    let mut change = record_step(step, Some(message));
    if let Some(op) = change.operation.as_mut() {
        op.state = MachineState::Failed;
        op.error_code = code.map(str::to_owned);
    }
    change
}

/// How to drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMode {
    /// Evict pods through the eviction subresource (honours PodDisruptionBudgets).
    Graceful,
    /// Delete pods directly.
    Force,
}

/// Graceful unless the drain timeout has passed since deletion started, the Node has been
/// unhealthy for more than 5 minutes, or the Machine carries `force-deletion=true`.
pub fn drain_mode(
    machine: &Machine,
    deletion_started: Timestamp,
    drain_timeout: Duration,
    node_unhealthy_since: Option<Timestamp>,
    now: Timestamp,
) -> DrainMode {
    let forced_by_label = machine
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_FORCE_DELETION))
        .is_some_and(|v| v == "true");
    let timed_out = elapsed(deletion_started, now) > drain_timeout;
    let long_unhealthy =
        node_unhealthy_since.is_some_and(|t| elapsed(t, now) > Duration::from_secs(5 * 60));
    if forced_by_label || timed_out || long_unhealthy {
        DrainMode::Force
    } else {
        DrainMode::Graceful
    }
}

/// True for pods a drain must remove: not owned by a DaemonSet, not a mirror pod, not finished.
pub fn pod_needs_eviction(pod: &Pod) -> bool {
    let daemon = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !daemon && !mirror && !finished
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_apis::machine::MachineStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn machine_after(change: Option<&StatusChange>) -> Machine {
        let mut m = Machine::new("m-1", Default::default());
        m.status = change.and_then(|c| c.apply(None, Timestamp::UNIX_EPOCH));
        m
    }

    #[test]
    fn every_recorded_step_resumes_at_itself() {
        assert_eq!(
            current_step(&machine_after(None)),
            DeletionStep::SetTerminating
        );
        let mut step = DeletionStep::GetVmStatus;
        loop {
            let recorded = record_step(step, Some("Drain successful"));
            assert_eq!(
                current_step(&machine_after(Some(&recorded))),
                step,
                "{step:?}"
            );
            let plain = record_step(step, None);
            assert_eq!(current_step(&machine_after(Some(&plain))), step);
            match step.next() {
                Some(next) => step = next,
                None => break,
            }
        }
    }

    #[test]
    fn terminating_without_a_marker_starts_at_vm_status() {
        let mut m = machine_after(Some(&StatusChange::phase(MachinePhase::Terminating)));
        assert_eq!(current_step(&m), DeletionStep::GetVmStatus);
        // A Running machine with a stale marker still first becomes Terminating.
        m.status = Some(MachineStatus::default());
        let rec = record_step(DeletionStep::DeleteVm, None);
        let mut status = rec.apply(None, Timestamp::UNIX_EPOCH).expect("set");
        if let Some(c) = status.current_status.as_mut() {
            c.phase = Some(MachinePhase::Running);
        }
        m.status = Some(status);
        assert_eq!(current_step(&m), DeletionStep::SetTerminating);
    }

    #[test]
    fn a_failed_step_resumes_at_itself() {
        let failed = record_step_failure(
            DeletionStep::DeleteVm,
            "Cloud provider message - down",
            Some("Unavailable"),
        );
        assert_eq!(
            current_step(&machine_after(Some(&failed))),
            DeletionStep::DeleteVm
        );
        let op = failed.operation.expect("op");
        assert_eq!(op.state, MachineState::Failed);
        assert_eq!(op.error_code.as_deref(), Some("Unavailable"));
    }

    #[test]
    fn drain_step_is_recorded_as_drain_operation() {
        let op = record_step(DeletionStep::Drain, None)
            .operation
            .expect("op");
        assert_eq!(op.kind, MachineOperationType::DrainNode);
        assert_eq!(op.description, INITIATE_DRAIN);
        assert_eq!(
            record_step(DeletionStep::DeleteVm, None)
                .operation
                .expect("op")
                .kind,
            MachineOperationType::Delete
        );
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    #[test]
    fn drain_is_forced_by_timeout_label_or_long_unhealthy_node() {
        let mut m = Machine::new("m", Default::default());
        let timeout = Duration::from_secs(60);
        assert_eq!(
            drain_mode(&m, at(0), timeout, None, at(30)),
            DrainMode::Graceful
        );
        assert_eq!(
            drain_mode(&m, at(0), timeout, None, at(61)),
            DrainMode::Force
        );
        assert_eq!(
            drain_mode(&m, at(0), timeout, Some(at(0)), at(30)),
            DrainMode::Graceful
        );
        assert_eq!(
            drain_mode(&m, at(0), Duration::from_secs(7200), Some(at(0)), at(301)),
            DrainMode::Force
        );
        m.metadata.labels = Some([("force-deletion".to_owned(), "true".to_owned())].into());
        assert_eq!(
            drain_mode(&m, at(0), timeout, None, at(1)),
            DrainMode::Force
        );
    }

    #[test]
    fn daemonset_mirror_and_finished_pods_are_not_evicted() {
        let plain = Pod::default();
        assert!(pod_needs_eviction(&plain));
        let ds = Pod {
            metadata: ObjectMeta {
                owner_references: Some(vec![OwnerReference {
                    kind: "DaemonSet".into(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        assert!(!pod_needs_eviction(&ds));
        let mirror = Pod {
            metadata: ObjectMeta {
                annotations: Some(
                    [("kubernetes.io/config.mirror".to_owned(), "x".to_owned())].into(),
                ),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        assert!(!pod_needs_eviction(&mirror));
        let done = Pod {
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Succeeded".into()),
                ..Default::default()
            }),
            ..Pod::default()
        };
        assert!(!pod_needs_eviction(&done));
    }
}
