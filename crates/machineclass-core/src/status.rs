//! Machine status updates: phase and lastOperation, written only when something changed.

use capstan_apis::machine::{
    CurrentStatus, LastOperation, MachineOperationType, MachinePhase, MachineState, MachineStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::Timestamp;

/// A `lastOperation` without its timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub description: String,
    pub error_code: Option<String>,
    pub state: MachineState,
    pub kind: MachineOperationType,
}

impl Operation {
    pub fn new(
        description: impl Into<String>,
        state: MachineState,
        kind: MachineOperationType,
    ) -> Self {
        Self {
            description: description.into(),
            error_code: None,
            state,
            kind,
        }
    }

    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.error_code = Some(code.into());
        self
    }

    fn matches(&self, op: &LastOperation) -> bool {
        op.description.as_deref() == Some(self.description.as_str())
            && op.error_code.as_deref().filter(|c| !c.is_empty()) == self.error_code.as_deref()
            && op.state.as_ref() == Some(&self.state)
            && op.type_.as_ref() == Some(&self.kind)
    }
}

/// A desired change of a Machine's status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusChange {
    pub phase: Option<MachinePhase>,
    /// `currentStatus.timeoutActive`, set with the phase.
    pub timeout_active: Option<bool>,
    pub operation: Option<Operation>,
}

impl StatusChange {
    pub fn phase(phase: MachinePhase) -> Self {
        Self {
            phase: Some(phase),
            ..Self::default()
        }
    }

    pub fn operation(operation: Operation) -> Self {
        Self {
            operation: Some(operation),
            ..Self::default()
        }
    }

    pub fn with_operation(mut self, operation: Operation) -> Self {
        self.operation = Some(operation);
        self
    }

    pub fn with_timeout_active(mut self, active: bool) -> Self {
        self.timeout_active = Some(active);
        self
    }

    /// The new status, or `None` when the change is already in place (timestamps aside).
    /// `currentStatus.lastUpdateTime` moves only when the phase changes, so that phase timeouts
    /// count from the transition.
    pub fn apply(&self, status: Option<&MachineStatus>, now: Timestamp) -> Option<MachineStatus> {
        let mut next = status.cloned().unwrap_or_default();
        let mut changed = false;
        if let Some(phase) = &self.phase {
            let current = next
                .current_status
                .get_or_insert_with(CurrentStatus::default);
            if current.phase.as_ref() != Some(phase) {
                current.phase = Some(phase.clone());
                current.last_update_time = Some(Time(now));
                changed = true;
            }
            if let Some(active) = self.timeout_active
                && current.timeout_active != Some(active)
            {
                current.timeout_active = Some(active);
                changed = true;
            }
        }
        if let Some(op) = &self.operation
            && !next
                .last_operation
                .as_ref()
                .is_some_and(|last| op.matches(last))
        {
            next.last_operation = Some(LastOperation {
                description: Some(op.description.clone()),
                error_code: op.error_code.clone(),
                last_update_time: Some(Time(now)),
                state: Some(op.state.clone()),
                type_: Some(op.kind.clone()),
            });
            changed = true;
        }
        changed.then_some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    #[test]
    fn no_change_means_no_new_status() {
        let op = Operation::new(
            "Creating machine on cloud provider",
            MachineState::Processing,
            MachineOperationType::Create,
        );
        let change = StatusChange::phase(MachinePhase::Pending).with_operation(op);
        let first = change.apply(None, at(10)).expect("first write");
        assert_eq!(
            first.current_status.as_ref().and_then(|c| c.phase.clone()),
            Some(MachinePhase::Pending)
        );
        assert_eq!(
            change.apply(Some(&first), at(20)),
            None,
            "same phase and operation: no write"
        );
    }

    #[test]
    fn phase_time_moves_only_on_phase_change() {
        let start = StatusChange::phase(MachinePhase::Pending)
            .apply(None, at(10))
            .expect("set");
        let op = Operation::new("x", MachineState::Failed, MachineOperationType::Create)
            .with_code("Unknown");
        let same_phase = StatusChange::phase(MachinePhase::Pending)
            .with_operation(op)
            .apply(Some(&start), at(50))
            .expect("operation changed");
        let current = same_phase.current_status.expect("current");
        assert_eq!(current.last_update_time, Some(Time(at(10))));
        let last = same_phase.last_operation.expect("op");
        assert_eq!(last.last_update_time, Some(Time(at(50))));
        assert_eq!(last.error_code.as_deref(), Some("Unknown"));
    }
}
