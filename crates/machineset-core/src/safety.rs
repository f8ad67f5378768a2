//! MCM's safety controller, overshooting half (`machine_safety.go` of machine-controller-manager):
//! a MachineSet backed by many more Machines than it should ever have is frozen (label
//! `freeze: "True"` and a `Frozen` condition, on the set and its deployment), so it creates no
//! more, until the count falls back.

/// MCM's `--safety-up`: Machines tolerated above the most a set may legitimately have.
pub const DEFAULT_SAFETY_UP: i32 = 2;
/// MCM's `--safety-down`: how far below the freeze limit the count must fall to unfreeze.
pub const DEFAULT_SAFETY_DOWN: i32 = 1;
/// Reason of the `Frozen` condition.
pub const REASON_OVERSHOOTING: &str = "OverShootingReplicaCount";
/// Annotation (any value) an operator sets on a set or deployment to unfreeze it by hand.
pub const ANNOTATION_UNFREEZE: &str = "safety.machine.sapcloud.io/unfreeze";

/// The freeze thresholds of one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Freeze at this many Machines or more.
    pub higher: i32,
    /// Unfreeze at this many or fewer.
    pub lower: i32,
}

/// A set's thresholds: with a deployment, its replicas plus its surge plus `up`; a standalone set
/// may briefly hold twice its replicas, plus `up`. `lower` is `higher - down`.
pub fn limits(set_replicas: i32, deployment: Option<(i32, i32)>, up: i32, down: i32) -> Limits {
    let higher = match deployment {
        Some((replicas, surge)) => replicas + surge + up,
        None => 2 * set_replicas + up,
    };
    Limits {
        higher,
        lower: higher - down,
    }
}

/// What one set needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FreezeAction {
    /// Label and condition on the set and its deployment, with this message.
    Freeze(String),
    /// Label, condition and unfreeze annotation removed from both.
    Unfreeze,
    Nothing,
}

/// One set's freeze state as the safety pass sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreezeState {
    /// Machines backing the set (template labels and an owner reference to it, Terminating ones
    /// included).
    pub machines: i32,
    /// Labelled `freeze: "True"`.
    pub labelled: bool,
    /// Carries a `Frozen` condition.
    pub conditioned: bool,
    /// An operator asked to unfreeze it.
    pub unfreeze_requested: bool,
}

/// Freeze when not labelled and at or over `higher`; unfreeze when labelled or conditioned and
/// at or under `lower`, or when an operator asked (the next pass freezes again if still over).
pub fn decide(set: &str, state: FreezeState, limits: Limits) -> FreezeAction {
    let frozen = state.labelled || state.conditioned;
    if frozen && state.unfreeze_requested {
        return FreezeAction::Unfreeze;
    }
    if !state.labelled && state.machines >= limits.higher {
        return FreezeAction::Freeze(format!(
            "The number of machines backing MachineSet: {set} is {} >= {} which is the Max-ScaleUp-Limit",
            state.machines, limits.higher
        ));
    }
    if frozen && state.machines <= limits.lower {
        return FreezeAction::Unfreeze;
    }
    FreezeAction::Nothing
}

/// Reason of a deployment frozen because one of its sets is.
pub const REASON_STATE_SYNC: &str = "MachineDeploymentStateSync";
/// Message of that freeze, as MCM writes it.
pub const MESSAGE_STATE_SYNC: &str = "MachineDeployment State was inconsistent, hence safety controller has fixed this and frozen it";

/// What a deployment needs once no set did (MCM's deployment consistency and manual unfreeze).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentFreeze {
    /// An operator asked: thaw it and ask each of its sets to thaw (their pass does it).
    UnfreezeWithSets,
    /// A set of it is frozen but it is not (fully): freeze it with [`REASON_STATE_SYNC`].
    Freeze,
    /// None of its sets is frozen but it is: thaw it.
    Unfreeze,
    Nothing,
}

/// The deployment half of the safety pass: `labelled`/`conditioned` are the deployment's freeze
/// label and `Frozen` condition, `set_frozen` whether any of its sets carries either.
pub fn decide_deployment(
    labelled: bool,
    conditioned: bool,
    set_frozen: bool,
    unfreeze_requested: bool,
) -> DeploymentFreeze {
    if unfreeze_requested && (labelled || conditioned || set_frozen) {
        return DeploymentFreeze::UnfreezeWithSets;
    }
    match (set_frozen, labelled && conditioned, labelled || conditioned) {
        (true, false, _) => DeploymentFreeze::Freeze,
        (false, _, true) => DeploymentFreeze::Unfreeze,
        _ => DeploymentFreeze::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(machines: i32, frozen: bool) -> FreezeState {
        FreezeState {
            machines,
            labelled: frozen,
            conditioned: frozen,
            unfreeze_requested: false,
        }
    }

    /// docs/machineset.md SAFE-1.
    #[test]
    fn safe_1_a_deployments_set_freezes_at_six_and_thaws_at_five() {
        let l = limits(3, Some((3, 1)), DEFAULT_SAFETY_UP, DEFAULT_SAFETY_DOWN);
        assert_eq!(
            l,
            Limits {
                higher: 6,
                lower: 5
            }
        );
        assert_eq!(
            decide("ms", state(6, false), l),
            FreezeAction::Freeze(
                "The number of machines backing MachineSet: ms is 6 >= 6 which is the Max-ScaleUp-Limit"
                    .into()
            )
        );
        assert_eq!(decide("ms", state(6, true), l), FreezeAction::Nothing);
        assert_eq!(decide("ms", state(5, true), l), FreezeAction::Unfreeze);
        assert_eq!(decide("ms", state(5, false), l), FreezeAction::Nothing);
    }

    /// SAFE-2 and SAFE-3.
    #[test]
    fn safe_2_and_3_limits() {
        assert_eq!(
            limits(2, None, 2, 1),
            Limits {
                higher: 6,
                lower: 5
            }
        );
        // replicas 10, maxSurge 25% -> 3.
        assert_eq!(
            limits(4, Some((10, 3)), 2, 1),
            Limits {
                higher: 15,
                lower: 14
            }
        );
    }

    /// SAFE-6 (for a set): an operator's unfreeze wins, and a set still over the limit freezes
    /// again on the next pass.
    #[test]
    fn safe_6_manual_unfreeze() {
        let l = limits(1, None, 2, 1);
        let requested = FreezeState {
            unfreeze_requested: true,
            ..state(9, true)
        };
        assert_eq!(decide("ms", requested, l), FreezeAction::Unfreeze);
        assert!(matches!(
            decide("ms", state(9, false), l),
            FreezeAction::Freeze(_)
        ));
    }

    /// docs/machineset.md SAFE-5 and SAFE-6 (deployments).
    #[test]
    fn safe_5_and_6_deployment_consistency_and_manual_unfreeze() {
        // A frozen set and a deployment without label or condition: frozen to match.
        assert_eq!(
            decide_deployment(false, false, true, false),
            DeploymentFreeze::Freeze
        );
        assert_eq!(
            decide_deployment(true, false, true, false),
            DeploymentFreeze::Freeze
        );
        assert_eq!(
            decide_deployment(true, true, true, false),
            DeploymentFreeze::Nothing
        );
        // No frozen set but a labelled deployment: thawed.
        assert_eq!(
            decide_deployment(true, false, false, false),
            DeploymentFreeze::Unfreeze
        );
        assert_eq!(
            decide_deployment(false, false, false, false),
            DeploymentFreeze::Nothing
        );
        // An operator's annotation thaws it and its sets.
        assert_eq!(
            decide_deployment(true, true, true, true),
            DeploymentFreeze::UnfreezeWithSets
        );
        assert_eq!(
            decide_deployment(false, false, false, true),
            DeploymentFreeze::Nothing
        );
    }
}
