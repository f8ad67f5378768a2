//! What the set and deployment controllers read of one Machine: its phase class, its deletion
//! priority and whether it is available (MCM's `ActiveMachines`, `IsMachineActive`).

use std::cmp::Ordering;
use std::time::Duration;

use capstan_apis::machine::{
    ANNOTATION_MACHINE_PRIORITY, DEFAULT_MACHINE_PRIORITY, Machine, MachinePhase,
};

use crate::Timestamp;

/// The Machine's phase, if its status has one.
pub fn phase(machine: &Machine) -> Option<&MachinePhase> {
    machine
        .status
        .as_ref()
        .and_then(|s| s.current_status.as_ref())
        .and_then(|c| c.phase.as_ref())
}

/// Being deleted: phase `Terminating`, or a deletion timestamp the machine controller has not
/// turned into that phase yet.
///
/// **Decision:** MCM's set controller writes `Terminating` itself right after its delete call, so
/// MCM only tests the phase; ours leaves every Machine status write to the machine controller and
/// counts the deletion timestamp too, so a Machine just deleted is never counted as a replica.
pub fn is_terminating(machine: &Machine) -> bool {
    machine.metadata.deletion_timestamp.is_some()
        || matches!(phase(machine), Some(MachinePhase::Terminating))
}

/// Phase `Failed`: the set deletes it and creates a replacement.
pub fn is_failed(machine: &Machine) -> bool {
    matches!(phase(machine), Some(MachinePhase::Failed))
}

/// Phase `Running` and not being deleted: MCM's ready replica.
pub fn is_ready(machine: &Machine) -> bool {
    !is_terminating(machine) && matches!(phase(machine), Some(MachinePhase::Running))
}

/// Ready for at least `min_ready`, counted from the status' last phase change.
pub fn is_available(machine: &Machine, min_ready: Duration, now: Timestamp) -> bool {
    if !is_ready(machine) {
        return false;
    }
    if min_ready.is_zero() {
        return true;
    }
    let since = machine
        .status
        .as_ref()
        .and_then(|s| s.current_status.as_ref())
        .and_then(|c| c.last_update_time.as_ref())
        .map(|t| t.0);
    since.is_some_and(|since| {
        let nanos = now.as_nanosecond().saturating_sub(since.as_nanosecond());
        nanos >= i128::try_from(min_ready.as_nanos()).unwrap_or(i128::MAX)
    })
}

/// The `machinepriority.machine.sapcloud.io` annotation, or MCM's default 3 when it is absent or
/// not a number.
pub fn priority(machine: &Machine) -> i32 {
    machine
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_MACHINE_PRIORITY))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_MACHINE_PRIORITY)
}

/// MCM's phase rank for scale-down: lower goes first (`Terminating` 0, `Failed` 1,
/// `CrashLoopBackOff` 2, `Unknown` 3, `Pending` 4, `Available` 5, `Running` 6). A phase missing
/// from MCM's table (none yet, an unknown string) ranks 0 with `Terminating`, as Go's map lookup of
/// a missing key gives 0.
pub fn phase_rank(phase: Option<&MachinePhase>) -> u8 {
    match phase {
        Some(MachinePhase::Failed) => 1,
        Some(MachinePhase::CrashLoopBackOff) => 2,
        Some(MachinePhase::Unknown) => 3,
        Some(MachinePhase::Pending) => 4,
        Some(MachinePhase::Available) => 5,
        Some(MachinePhase::Running) => 6,
        _ => 0,
    }
}

fn created(machine: &Machine) -> Option<Timestamp> {
    machine.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// MCM's scale-down order (`ActiveMachines`): priority annotation ascending, then phase rank
/// ascending, then the older Machine first.
///
/// **Decision:** remaining ties are broken by name, so the choice is the same on every pass (Go's
/// `sort.Sort` is not stable and leaves ties in list order).
pub fn deletion_order(a: &Machine, b: &Machine) -> Ordering {
    priority(a)
        .cmp(&priority(b))
        .then_with(|| phase_rank(phase(a)).cmp(&phase_rank(phase(b))))
        .then_with(|| created(a).cmp(&created(b)))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The `count` Machines a scale-down removes first, by [`deletion_order`].
pub fn pick_for_deletion<'a>(machines: &[&'a Machine], count: usize) -> Vec<&'a Machine> {
    let mut sorted = machines.to_vec();
    sorted.sort_by(|a, b| deletion_order(a, b));
    sorted.truncate(count);
    sorted
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use capstan_apis::machine::{CurrentStatus, MachineSpec, MachineStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    pub(crate) fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    /// A Machine named `name` in `phase` since second 0.
    pub(crate) fn machine(name: &str, phase: Option<MachinePhase>) -> Machine {
        let mut m = Machine::new(name, MachineSpec::default());
        m.metadata.namespace = Some("ns".into());
        m.status = Some(MachineStatus {
            current_status: Some(CurrentStatus {
                phase,
                timeout_active: None,
                last_update_time: Some(Time(at(0))),
            }),
            ..MachineStatus::default()
        });
        m
    }

    pub(crate) fn with_priority(mut m: Machine, priority: &str) -> Machine {
        m.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_MACHINE_PRIORITY.to_owned(),
            priority.to_owned(),
        )]));
        m
    }

    fn names(machines: &[&Machine]) -> Vec<String> {
        machines
            .iter()
            .map(|m| m.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn scale_down_takes_the_earliest_phases_first() {
        let running = machine("a-running", Some(MachinePhase::Running));
        let pending = machine("b-pending", Some(MachinePhase::Pending));
        let failed = machine("c-failed", Some(MachinePhase::Failed));
        let unknown = machine("d-unknown", Some(MachinePhase::Unknown));
        let available = machine("e-available", Some(MachinePhase::Available));
        let all = [&running, &pending, &failed, &unknown, &available];
        assert_eq!(
            names(&pick_for_deletion(&all, 5)),
            [
                "c-failed",
                "d-unknown",
                "b-pending",
                "e-available",
                "a-running"
            ]
        );
        assert_eq!(
            names(&pick_for_deletion(&all, 2)),
            ["c-failed", "d-unknown"]
        );
    }

    #[test]
    fn the_priority_annotation_outranks_the_phase() {
        // The cluster-autoscaler marks the Machine it wants gone with priority 1.
        let marked = with_priority(machine("z-running", Some(MachinePhase::Running)), "1");
        let pending = machine("a-pending", Some(MachinePhase::Pending));
        let kept = with_priority(machine("b-pending", Some(MachinePhase::Pending)), "5");
        let garbled = with_priority(machine("c-running", Some(MachinePhase::Running)), "high");
        let all = [&pending, &kept, &marked, &garbled];
        assert_eq!(
            names(&pick_for_deletion(&all, 4)),
            ["z-running", "a-pending", "c-running", "b-pending"]
        );
    }

    #[test]
    fn phases_missing_from_mcms_table_rank_with_terminating() {
        assert_eq!(phase_rank(None), 0);
        assert_eq!(phase_rank(Some(&MachinePhase::CrashLoopBackOff)), 2);
        assert_eq!(phase_rank(Some(&MachinePhase::Other("Booting".into()))), 0);
        assert_eq!(phase_rank(Some(&MachinePhase::Terminating)), 0);
        assert!(phase_rank(Some(&MachinePhase::Failed)) < phase_rank(Some(&MachinePhase::Running)));
    }

    fn created_at(mut m: Machine, secs: i64) -> Machine {
        m.metadata.creation_timestamp = Some(Time(at(secs)));
        m
    }

    /// docs/machineset.md MS-1: priority 1 first, then Pending before Running.
    #[test]
    fn ms_1_priority_then_phase() {
        let a = created_at(machine("a", Some(MachinePhase::Running)), 1);
        let b = created_at(
            with_priority(machine("b", Some(MachinePhase::Running)), "1"),
            2,
        );
        let c = created_at(machine("c", Some(MachinePhase::Pending)), 3);
        let d = created_at(machine("d", Some(MachinePhase::Running)), 0);
        assert_eq!(names(&pick_for_deletion(&[&a, &b, &c, &d], 2)), ["b", "c"]);
    }

    /// MS-2: an unparsable priority counts as 3, so priority 2 goes first.
    #[test]
    fn ms_2_unparsable_priority_is_three() {
        let x = with_priority(machine("x", Some(MachinePhase::Running)), "abc");
        let y = created_at(
            with_priority(machine("y", Some(MachinePhase::Running)), "2"),
            5,
        );
        let z = created_at(machine("z", Some(MachinePhase::Running)), 1);
        assert_eq!(names(&pick_for_deletion(&[&x, &y, &z], 1)), ["y"]);
    }

    /// MS-3: otherwise equal, the older Machine goes first.
    #[test]
    fn ms_3_the_older_goes_first() {
        let young = created_at(machine("a-young", Some(MachinePhase::Running)), 1);
        let old = created_at(machine("z-old", Some(MachinePhase::Running)), 0);
        assert_eq!(names(&pick_for_deletion(&[&young, &old], 1)), ["z-old"]);
    }

    /// MS-4: an empty phase ranks 0, before Failed.
    #[test]
    fn ms_4_no_phase_before_failed() {
        let p = machine("p", None);
        let f = machine("f", Some(MachinePhase::Failed));
        assert_eq!(names(&pick_for_deletion(&[&f, &p], 1)), ["p"]);
    }

    #[test]
    fn availability_waits_min_ready_seconds_after_running() {
        let running = machine("m", Some(MachinePhase::Running));
        assert!(is_available(&running, Duration::ZERO, at(0)));
        assert!(!is_available(&running, Duration::from_secs(10), at(9)));
        assert!(is_available(&running, Duration::from_secs(10), at(10)));
        let pending = machine("p", Some(MachinePhase::Pending));
        assert!(!is_available(&pending, Duration::ZERO, at(100)));
    }

    #[test]
    fn a_deleted_machine_is_terminating_before_its_phase_says_so() {
        let mut m = machine("m", Some(MachinePhase::Running));
        assert!(!is_terminating(&m) && is_ready(&m));
        m.metadata.deletion_timestamp = Some(Time(at(5)));
        assert!(is_terminating(&m) && !is_ready(&m));
    }
}
