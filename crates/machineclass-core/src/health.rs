//! Node health and the phase transitions it drives (MCM's `reconcileMachineHealth`).

use std::time::Duration;

use capstan_apis::machine::{MachineOperationType, MachinePhase, MachineState};
use k8s_openapi::api::core::v1::NodeCondition;

use crate::Timestamp;
use crate::driver_error::elapsed;
use crate::status::{Operation, StatusChange};
use crate::validate::MachineTimeouts;

/// True when the Node has conditions, `Ready=True`, and none of `unhealthy_types` is True.
pub fn node_is_healthy(conditions: &[NodeCondition], unhealthy_types: &[String]) -> bool {
    let ready = conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let bad = conditions
        .iter()
        .any(|c| c.status == "True" && unhealthy_types.contains(&c.type_));
    !conditions.is_empty() && ready && !bad
}

fn describe(conditions: &[NodeCondition]) -> String {
    let parts: Vec<String> = conditions
        .iter()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Everything the health decision needs about one Machine.
#[derive(Debug, Clone)]
pub struct HealthInput<'a> {
    pub machine_name: &'a str,
    pub phase: Option<&'a MachinePhase>,
    /// When the phase was entered (`currentStatus.lastUpdateTime`, else the creation time).
    pub phase_since: Timestamp,
    /// The Node's conditions, `None` when the Node is missing.
    pub node_conditions: Option<&'a [NodeCondition]>,
    /// `spec.nodeConditions` (or the default list).
    pub unhealthy_types: &'a [String],
    pub timeouts: MachineTimeouts,
    /// Another machine of the same machine deployment (label `name`) is already Failed.
    pub another_failed_in_deployment: bool,
    pub now: Timestamp,
}

/// The result of a health check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthDecision {
    /// The status change to write, if any.
    pub change: Option<StatusChange>,
    /// When to look again (a running timeout).
    pub recheck_after: Option<Duration>,
    /// The health timeout expired but another machine of the deployment is already Failed.
    pub replacement_deferred: bool,
}

/// Decides phase transitions from Node health and phase timeouts.
pub fn evaluate_health(input: &HealthInput<'_>) -> HealthDecision {
    let name = input.machine_name;
    let healthy = input
        .node_conditions
        .is_some_and(|c| node_is_healthy(c, input.unhealthy_types));
    let since = elapsed(input.phase_since, input.now);
    match (input.phase, healthy) {
        (Some(MachinePhase::Pending), true) => transition(
            MachinePhase::Running,
            false,
            Operation::new(
                format!("Machine {name} successfully joined the cluster"),
                MachineState::Successful,
                MachineOperationType::Create,
            ),
        ),
        (Some(MachinePhase::Unknown), true) => transition(
            MachinePhase::Running,
            false,
            Operation::new(
                format!("Machine {name} successfully re-joined the cluster"),
                MachineState::Successful,
                MachineOperationType::HealthCheck,
            ),
        ),
        (Some(MachinePhase::Running), false) => {
            let description = match input.node_conditions {
                Some(c) => format!(
                    "Machine {name} is unhealthy - changing MachineState to Unknown. Node conditions: {}",
                    describe(c)
                ),
                None => format!(
                    "Node object went missing. Machine {name} is unhealthy - changing MachineState to Unknown"
                ),
            };
            let mut decision = transition(
                MachinePhase::Unknown,
                true,
                Operation::new(
                    description,
                    MachineState::Processing,
                    MachineOperationType::HealthCheck,
                ),
            );
            if !input.timeouts.disable_health_timeout {
                decision.recheck_after = Some(input.timeouts.health);
            }
            decision
        }
        (Some(MachinePhase::Pending), false) => {
            let timeout = input.timeouts.creation;
            if since <= timeout {
                return recheck(timeout - since);
            }
            transition(
                MachinePhase::Failed,
                false,
                Operation::new(
                    format!(
                        "Machine {name} failed to join the cluster in {} minutes.",
                        minutes(timeout)
                    ),
                    MachineState::Failed,
                    MachineOperationType::Create,
                ),
            )
        }
        (Some(MachinePhase::Unknown), false) => {
            let timeout = input.timeouts.health;
            if input.timeouts.disable_health_timeout {
                return HealthDecision::default();
            }
            if since <= timeout {
                return recheck(timeout - since);
            }
            if input.another_failed_in_deployment {
                return HealthDecision {
                    replacement_deferred: true,
                    ..HealthDecision::default()
                };
            }
            let conditions = input
                .node_conditions
                .map(describe)
                .unwrap_or_else(|| "node missing".into());
            transition(
                MachinePhase::Failed,
                false,
                Operation::new(
                    format!(
                        "Machine {name} is not healthy since {} minutes. Changing status to failed. Node Conditions: {conditions}",
                        minutes(timeout)
                    ),
                    MachineState::Failed,
                    MachineOperationType::HealthCheck,
                ),
            )
        }
        _ => HealthDecision::default(),
    }
}

fn minutes(d: Duration) -> String {
    let m = d.as_secs_f64() / 60.0;
    format!("{}", (m * 100.0).round() / 100.0)
}

fn transition(phase: MachinePhase, timeout_active: bool, operation: Operation) -> HealthDecision {
    HealthDecision {
        change: Some(
            StatusChange::phase(phase)
                .with_timeout_active(timeout_active)
                .with_operation(operation),
        ),
        ..HealthDecision::default()
    }
}

fn recheck(after: Duration) -> HealthDecision {
    HealthDecision {
        recheck_after: Some(after),
        ..HealthDecision::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, s: &str) -> NodeCondition {
        NodeCondition {
            type_: t.into(),
            status: s.into(),
            ..NodeCondition::default()
        }
    }

    fn defaults() -> Vec<String> {
        capstan_apis::machine::DEFAULT_NODE_CONDITIONS
            .split(',')
            .map(str::to_owned)
            .collect()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    fn timeouts() -> MachineTimeouts {
        MachineTimeouts {
            creation: Duration::from_secs(1200),
            health: Duration::from_secs(600),
            drain: Duration::from_secs(7200),
            disable_health_timeout: false,
        }
    }

    fn input<'a>(
        phase: &'a MachinePhase,
        conds: Option<&'a [NodeCondition]>,
        types: &'a [String],
        now: i64,
    ) -> HealthInput<'a> {
        HealthInput {
            machine_name: "m-1",
            phase: Some(phase),
            phase_since: at(0),
            node_conditions: conds,
            unhealthy_types: types,
            timeouts: timeouts(),
            another_failed_in_deployment: false,
            now: at(now),
        }
    }

    fn new_phase(d: &HealthDecision) -> Option<MachinePhase> {
        d.change.as_ref().and_then(|c| c.phase.clone())
    }

    #[test]
    fn healthy_needs_ready_and_no_bad_condition() {
        let types = defaults();
        assert!(node_is_healthy(
            &[cond("Ready", "True"), cond("DiskPressure", "False")],
            &types
        ));
        assert!(!node_is_healthy(&[], &types));
        assert!(!node_is_healthy(&[cond("Ready", "False")], &types));
        assert!(!node_is_healthy(
            &[cond("Ready", "True"), cond("DiskPressure", "True")],
            &types
        ));
        // A condition outside the configured list does not matter.
        assert!(node_is_healthy(
            &[cond("Ready", "True"), cond("MemoryPressure", "True")],
            &types
        ));
        let custom = vec!["MemoryPressure".to_owned()];
        assert!(!node_is_healthy(
            &[cond("Ready", "True"), cond("MemoryPressure", "True")],
            &custom
        ));
    }

    #[test]
    fn pending_and_unknown_become_running_when_healthy() {
        let types = defaults();
        let ready = [cond("Ready", "True")];
        let d = evaluate_health(&input(&MachinePhase::Pending, Some(&ready), &types, 5));
        assert_eq!(new_phase(&d), Some(MachinePhase::Running));
        let op = d
            .change
            .as_ref()
            .and_then(|c| c.operation.clone())
            .expect("op");
        assert_eq!(
            op.description,
            "Machine m-1 successfully joined the cluster"
        );
        assert_eq!(op.state, MachineState::Successful);
        let d = evaluate_health(&input(&MachinePhase::Unknown, Some(&ready), &types, 5));
        assert_eq!(new_phase(&d), Some(MachinePhase::Running));
        // Running and healthy: nothing to do.
        assert_eq!(
            evaluate_health(&input(&MachinePhase::Running, Some(&ready), &types, 5)),
            HealthDecision::default()
        );
    }

    #[test]
    fn running_becomes_unknown_when_unhealthy_or_node_missing() {
        let types = defaults();
        let sick = [cond("Ready", "True"), cond("KernelDeadlock", "True")];
        let d = evaluate_health(&input(&MachinePhase::Running, Some(&sick), &types, 5));
        assert_eq!(new_phase(&d), Some(MachinePhase::Unknown));
        assert_eq!(d.recheck_after, Some(Duration::from_secs(600)));
        let c = d.change.expect("change");
        assert_eq!(c.timeout_active, Some(true));
        assert!(
            c.operation
                .expect("op")
                .description
                .contains("KernelDeadlock=True")
        );
        let d = evaluate_health(&input(&MachinePhase::Running, None, &types, 5));
        assert_eq!(new_phase(&d), Some(MachinePhase::Unknown));
    }

    #[test]
    fn pending_fails_after_creation_timeout() {
        let types = defaults();
        let d = evaluate_health(&input(&MachinePhase::Pending, None, &types, 1000));
        assert_eq!(d.change, None);
        assert_eq!(d.recheck_after, Some(Duration::from_secs(200)));
        let d = evaluate_health(&input(&MachinePhase::Pending, None, &types, 1201));
        assert_eq!(new_phase(&d), Some(MachinePhase::Failed));
        let op = d.change.and_then(|c| c.operation).expect("op");
        assert_eq!(
            op.description,
            "Machine m-1 failed to join the cluster in 20 minutes."
        );
    }

    #[test]
    fn unknown_fails_after_health_timeout_unless_disabled() {
        let types = defaults();
        let notready = [cond("Ready", "False")];
        let d = evaluate_health(&input(&MachinePhase::Unknown, Some(&notready), &types, 599));
        assert_eq!(
            (d.change, d.recheck_after),
            (None, Some(Duration::from_secs(1)))
        );
        let d = evaluate_health(&input(&MachinePhase::Unknown, Some(&notready), &types, 601));
        assert_eq!(new_phase(&d), Some(MachinePhase::Failed));
        let mut i = input(&MachinePhase::Unknown, Some(&notready), &types, 10_000);
        i.timeouts.disable_health_timeout = true;
        assert_eq!(evaluate_health(&i), HealthDecision::default());
    }

    #[test]
    fn at_most_one_failed_machine_per_deployment() {
        let types = defaults();
        let mut i = input(&MachinePhase::Unknown, None, &types, 601);
        i.another_failed_in_deployment = true;
        let d = evaluate_health(&i);
        assert_eq!(d.change, None);
        assert!(d.replacement_deferred);
        // The creation timeout of a Pending machine is not limited that way.
        let mut i = input(&MachinePhase::Pending, None, &types, 1201);
        i.another_failed_in_deployment = true;
        assert_eq!(new_phase(&evaluate_health(&i)), Some(MachinePhase::Failed));
    }
}
