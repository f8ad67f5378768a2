//! One MachineSet: how many Machines to create or which to delete (MCM's `manageReplicas`), and
//! the status it reports (`calculateMachineSetStatus`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use capstan_apis::machine::{
    ANNOTATION_MACHINE_PRIORITY, ConditionStatus, LastOperation, Machine, MachinePhase, MachineSet,
    MachineSetCondition, MachineSetConditionType, MachineSetStatus, MachineState, MachineSummary,
};
use capstan_apis::selector::{Selector, SelectorError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

use crate::Timestamp;
use crate::deployment::NAME_ALPHABET;
use crate::machines::{is_available, is_failed, is_terminating, phase, pick_for_deletion};
use crate::ownership::controller_of;

/// MCM's cap on the Machines one pass of one set creates or deletes.
pub const BURST_REPLICAS: usize = 100;
/// MachineSet (and MachineDeployment) label the safety controller sets to `"True"` to stop scale-up.
pub const LABEL_FREEZE: &str = "freeze";
/// MachineSet label (presence) that stops scale-up, as during MCM's in-place updates.
pub const LABEL_SCALE_UP_DISABLED: &str = "node.machine.sapcloud.io/scale-up-disabled";
/// Machine annotation: when the cluster-autoscaler marked it for deletion (RFC 3339).
pub const ANNOTATION_MARKED_FOR_DELETION: &str = "machine.sapcloud.io/marked-for-deletion-time";
/// MachineSet (and MachineDeployment) annotation: when a scaler last changed the replicas.
pub const ANNOTATION_SCALER_CHANGE: &str =
    "machine.sapcloud.io/last-deployment-replica-change-by-scaler-time";

/// Why a set's or deployment's selector cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetSelectorError {
    #[error(
        "spec.selector: a non-empty selector is required (an empty one would select all machines)"
    )]
    Empty,
    #[error("spec.selector: {0}")]
    Invalid(#[from] SelectorError),
    #[error(
        "spec.template.metadata.labels: the selector does not match the template's labels, so no Machine made from the template would count"
    )]
    TemplateNotSelected,
}

/// A selector validated as MCM validates a MachineSet or MachineDeployment: non-empty, and
/// matching the template's labels.
pub fn validated_selector(
    raw: Option<&LabelSelector>,
    template_labels: &BTreeMap<String, String>,
) -> Result<Selector, SetSelectorError> {
    let raw = raw.ok_or(SetSelectorError::Empty)?;
    let empty = raw.match_labels.as_ref().is_none_or(|l| l.is_empty())
        && raw.match_expressions.as_ref().is_none_or(|e| e.is_empty());
    if empty {
        return Err(SetSelectorError::Empty);
    }
    let selector = Selector::parse(raw)?;
    if !selector.matches(template_labels) {
        return Err(SetSelectorError::TemplateNotSelected);
    }
    Ok(selector)
}

/// The set's selector (see [`validated_selector`]).
pub fn selector_of(set: &MachineSet) -> Result<Selector, SetSelectorError> {
    let template_labels = set
        .spec
        .template
        .as_ref()
        .map(|t| t.labels())
        .unwrap_or_default();
    validated_selector(set.spec.selector.as_ref(), &template_labels)
}

/// True when the safety controller froze the object, a set or a deployment (`freeze: "True"`).
pub fn has_freeze_label(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(LABEL_FREEZE))
        .is_some_and(|v| v == "True")
}

/// True when the safety controller froze the set.
pub fn is_frozen(set: &MachineSet) -> bool {
    has_freeze_label(&set.metadata)
}

fn scale_up_disabled(set: &MachineSet) -> bool {
    set.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_SCALE_UP_DISABLED))
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Marked by the autoscaler (priority `"1"` and a mark time) at or before the set's last
/// scaler change: MCM deletes it even without a replica difference.
fn marked_before_scaler_change(set: &MachineSet, machine: &Machine) -> bool {
    let Some(change) = annotation(&set.metadata, ANNOTATION_SCALER_CHANGE)
        .and_then(|t| t.parse::<Timestamp>().ok())
    else {
        return false;
    };
    annotation(&machine.metadata, ANNOTATION_MACHINE_PRIORITY) == Some("1")
        && annotation(&machine.metadata, ANNOTATION_MARKED_FOR_DELETION)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|marked| marked <= change)
}

/// What one pass does to a set's Machines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaPlan {
    /// Machines to create from the template.
    pub create: usize,
    /// Machines to delete, by name: surplus in MCM's scale-down order, then failed ones.
    pub delete: Vec<String>,
    /// Set when scale-up was due but the set is frozen.
    pub frozen: bool,
}

/// MCM's `manageReplicas` for a set that is not being deleted, over the Machines it owns.
///
/// Terminating Machines are not replicas. Too few: create the difference (at most
/// [`BURST_REPLICAS`]) unless frozen or scale-up is disabled, and nothing else this pass.
/// Otherwise delete the surplus in [`pick_for_deletion`] order, the Machines the autoscaler marked
/// before the set's last scaler change, and every Failed Machine (MCM replaces a failed Machine
/// by deleting it), at most [`BURST_REPLICAS`] in all.
pub fn plan_replicas(set: &MachineSet, owned: &[&Machine]) -> ReplicaPlan {
    let live: Vec<&Machine> = owned
        .iter()
        .copied()
        .filter(|m| !is_terminating(m))
        .collect();
    let desired = usize::try_from(set.spec.replicas.max(0)).unwrap_or(0);
    if live.len() < desired {
        if is_frozen(set) || scale_up_disabled(set) {
            return ReplicaPlan {
                frozen: true,
                ..ReplicaPlan::default()
            };
        }
        return ReplicaPlan {
            create: (desired - live.len()).min(BURST_REPLICAS),
            ..ReplicaPlan::default()
        };
    }
    let surplus = live.len() - desired;
    let mut delete: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    let picked = pick_for_deletion(&live, surplus.min(BURST_REPLICAS));
    let marked = live
        .iter()
        .copied()
        .filter(|m| marked_before_scaler_change(set, m));
    let failed = live.iter().copied().filter(|m| is_failed(m));
    for machine in picked.into_iter().chain(marked).chain(failed) {
        let name = machine.metadata.name.clone().unwrap_or_default();
        if seen.insert(name.clone()) {
            delete.push(name);
        }
    }
    delete.truncate(BURST_REPLICAS);
    ReplicaPlan {
        delete,
        ..ReplicaPlan::default()
    }
}

/// The status a set reports for the Machines it owns, as MCM counts them: every owned Machine
/// (Terminating included) is a replica; `readyReplicas` are Running, `availableReplicas` Running
/// or Available. `failure` is this pass's create or delete error: it sets the `ReplicaFailure`
/// condition (reason `FailedCreate` with fewer Machines than replicas, `FailedDelete` with more),
/// which an error-free pass removes.
///
/// **Decision:** `availableReplicas` also waits `minReadySeconds` after the phase turned Running,
/// as the field says; MCM does not apply it (0, the default, behaves the same).
pub fn status(
    set: &MachineSet,
    owned: &[&Machine],
    failure: Option<&str>,
    now: Timestamp,
) -> MachineSetStatus {
    let min_ready = Duration::from_secs(u64::try_from(set.spec.min_ready_seconds).unwrap_or(0));
    let template_labels = set
        .spec
        .template
        .as_ref()
        .map(|t| t.labels())
        .unwrap_or_default();
    let fully_labeled = owned
        .iter()
        .filter(|m| {
            let labels = m.metadata.labels.clone().unwrap_or_default();
            template_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
        })
        .count();
    let ready = owned
        .iter()
        .filter(|m| matches!(phase(m), Some(MachinePhase::Running)))
        .count();
    let available = owned
        .iter()
        .filter(|m| match phase(m) {
            Some(MachinePhase::Available) => true,
            Some(MachinePhase::Running) => min_ready.is_zero() || is_available(m, min_ready, now),
            _ => false,
        })
        .count();
    let failed: Vec<MachineSummary> = owned
        .iter()
        .filter_map(|m| {
            let op = m.status.as_ref()?.last_operation.as_ref()?;
            (op.state == Some(MachineState::Failed)).then(|| summary(m, op))
        })
        .collect();
    let previous = set.status.clone().unwrap_or_default();
    let is_failure = |c: &MachineSetCondition| c.type_ == MachineSetConditionType::ReplicaFailure;
    let mut conditions: Vec<MachineSetCondition> = previous
        .conditions
        .iter()
        .flatten()
        .filter(|c| !is_failure(c))
        .cloned()
        .collect();
    if let Some(message) = failure {
        let desired = usize::try_from(set.spec.replicas.max(0)).unwrap_or(0);
        let reason = match owned.len().cmp(&desired) {
            std::cmp::Ordering::Less => Some("FailedCreate"),
            std::cmp::Ordering::Greater => Some("FailedDelete"),
            std::cmp::Ordering::Equal => None,
        };
        // An existing ReplicaFailure stays as it was (MCM: same status and reason is a no-op).
        let kept = previous
            .conditions
            .iter()
            .flatten()
            .find(|c| is_failure(c))
            .cloned();
        conditions.push(kept.unwrap_or(MachineSetCondition {
            type_: MachineSetConditionType::ReplicaFailure,
            status: ConditionStatus::True,
            last_transition_time: Some(Time(now)),
            reason: reason.map(str::to_owned),
            message: Some(message.to_owned()),
        }));
    }
    MachineSetStatus {
        replicas: count(owned.len()),
        fully_labeled_replicas: count(fully_labeled),
        ready_replicas: count(ready),
        available_replicas: count(available),
        observed_generation: set.metadata.generation.unwrap_or(0),
        failed_machines: (!failed.is_empty()).then_some(failed),
        conditions: (!conditions.is_empty()).then_some(conditions),
        // MCM's set controller never writes lastOperation: carried over.
        last_operation: previous.last_operation,
        auto_preserve_failed_machine_count: previous.auto_preserve_failed_machine_count,
    }
}

/// A new Machine's name: the set's, a dash and five characters drawn from `entropy` in
/// Kubernetes' name-suffix alphabet (what `generateName` would give).
///
/// **Decision:** named by us rather than by the API server (MCM sends `generateName`) so that
/// the create can be recorded before its watch event arrives and a retried create cannot make a
/// second Machine under another name.
/// Whether a set's Machines are still changing: fewer or more than its replicas, or one not yet
/// available or being deleted. A busy set's status is about to change again, so its writes may
/// be batched (`capstan_runtime::status_batch`).
pub fn is_busy(set: &MachineSet, owned: &[&Machine], now: Timestamp) -> bool {
    let min_ready = Duration::from_secs(u64::try_from(set.spec.min_ready_seconds).unwrap_or(0));
    usize::try_from(set.spec.replicas).ok() != Some(owned.len())
        || owned
            .iter()
            .any(|m| is_terminating(m) || !is_available(m, min_ready, now))
}

pub fn machine_name(set: &str, entropy: u64) -> String {
    let base = NAME_ALPHABET.len() as u64;
    let mut rest = entropy;
    let suffix: String = (0..5)
        .map(|_| {
            let c = NAME_ALPHABET[usize::try_from(rest % base).unwrap_or(0)];
            rest /= base;
            char::from(c)
        })
        .collect();
    format!("{set}-{suffix}")
}

fn summary(machine: &Machine, op: &LastOperation) -> MachineSummary {
    MachineSummary {
        name: machine.metadata.name.clone(),
        provider_id: machine.spec.provider_id.clone(),
        last_operation: Some(op.clone()),
        owner_ref: controller_of(&machine.metadata).map(|r| r.name.clone()),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use capstan_apis::machine::{MachinePhase, MachineSetSpec, MachineTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

    use super::*;
    use crate::machines::tests::{at, machine, with_priority};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn set(replicas: i32) -> MachineSet {
        let mut set = MachineSet::new(
            "pool-a-1",
            MachineSetSpec {
                replicas,
                selector: Some(LabelSelector {
                    match_labels: Some(labels(&[("name", "pool-a")])),
                    match_expressions: None,
                }),
                template: Some(MachineTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels(&[("name", "pool-a"), ("zone", "a")])),
                        ..ObjectMeta::default()
                    }),
                    spec: None,
                }),
                ..MachineSetSpec::default()
            },
        );
        set.metadata.generation = Some(3);
        set
    }

    fn running(name: &str) -> Machine {
        machine(name, Some(MachinePhase::Running))
    }

    #[test]
    fn a_set_is_busy_until_its_replicas_are_all_available_and_none_is_deleting() {
        let now = at(1000);
        let (a, b) = (running("a"), running("b"));
        assert!(!is_busy(&set(2), &[&a, &b], now), "at rest");
        assert!(is_busy(&set(3), &[&a, &b], now), "one to create");
        assert!(is_busy(&set(1), &[&a, &b], now), "one to delete");
        let pending = machine("c", Some(MachinePhase::Pending));
        assert!(is_busy(&set(2), &[&a, &pending], now), "one starting");
        let mut deleting = running("d");
        deleting.metadata.deletion_timestamp = Some(Time(now));
        assert!(is_busy(&set(2), &[&a, &deleting], now), "one going");
    }

    #[test]
    fn scale_up_from_zero_creates_the_difference() {
        let plan = plan_replicas(&set(5), &[]);
        assert_eq!(
            plan,
            ReplicaPlan {
                create: 5,
                ..ReplicaPlan::default()
            }
        );
    }

    #[test]
    fn scale_up_is_capped_by_the_burst() {
        assert_eq!(plan_replicas(&set(250), &[]).create, BURST_REPLICAS);
    }

    #[test]
    fn scale_down_5_to_2_deletes_the_earliest_phases() {
        let a = running("a");
        let b = machine("b", Some(MachinePhase::Pending));
        let c = running("c");
        let d = machine("d", Some(MachinePhase::Unknown));
        let e = running("e");
        let plan = plan_replicas(&set(2), &[&a, &b, &c, &d, &e]);
        assert_eq!(plan.delete, ["d", "b", "a"]);
        assert_eq!(plan.create, 0);
    }

    #[test]
    fn the_machine_the_autoscaler_marked_goes_first() {
        let a = running("a");
        let b = with_priority(running("b"), "1");
        let c = running("c");
        assert_eq!(plan_replicas(&set(2), &[&a, &b, &c]).delete, ["b"]);
    }

    #[test]
    fn terminating_machines_are_not_replicas() {
        let mut gone = running("gone");
        gone.metadata.deletion_timestamp = Some(Time(at(1)));
        let terminating = machine("t", Some(MachinePhase::Terminating));
        let a = running("a");
        let plan = plan_replicas(&set(2), &[&gone, &terminating, &a]);
        assert_eq!(plan.create, 1);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn a_failed_machine_is_deleted_to_be_replaced() {
        let a = running("a");
        let failed = machine("f", Some(MachinePhase::Failed));
        let plan = plan_replicas(&set(2), &[&a, &failed]);
        assert_eq!(plan.delete, ["f"]);
        // Surplus and failed together: the failed one is picked first and counted once.
        let b = running("b");
        assert_eq!(plan_replicas(&set(2), &[&a, &b, &failed]).delete, ["f"]);
    }

    #[test]
    fn a_frozen_set_does_not_scale_up_but_still_scales_down() {
        let mut frozen = set(3);
        frozen.metadata.labels = Some(labels(&[(LABEL_FREEZE, "True")]));
        let plan = plan_replicas(&frozen, &[]);
        assert!(plan.frozen && plan.create == 0);
        frozen.spec.replicas = 0;
        let a = running("a");
        assert_eq!(plan_replicas(&frozen, &[&a]).delete, ["a"]);
    }

    fn labelled(mut m: Machine) -> Machine {
        m.metadata.labels = Some(labels(&[("name", "pool-a"), ("zone", "a")]));
        m
    }

    /// docs/machineset.md MS-14.
    #[test]
    fn ms_14_status_counts_as_mcm_counts() {
        let s = set(5);
        let machines = [
            labelled(running("a")),
            labelled(running("b")),
            labelled(machine("c", Some(MachinePhase::Available))),
            labelled(machine("d", Some(MachinePhase::Pending))),
            labelled(machine("e", Some(MachinePhase::Terminating))),
        ];
        let refs: Vec<&Machine> = machines.iter().collect();
        let st = status(&s, &refs, None, at(100));
        assert_eq!(
            (
                st.replicas,
                st.fully_labeled_replicas,
                st.available_replicas,
                st.ready_replicas
            ),
            (5, 5, 3, 2)
        );
        assert_eq!(st.observed_generation, 3);
        assert_eq!(st.conditions, None);
    }

    #[test]
    fn failed_machines_are_summarised_and_min_ready_seconds_delays_availability() {
        let mut s = set(2);
        s.spec.min_ready_seconds = 10;
        let mut young = running("young");
        young
            .status
            .as_mut()
            .and_then(|st| st.current_status.as_mut())
            .expect("status")
            .last_update_time = Some(Time(at(95)));
        let mut failed = machine("failed", Some(MachinePhase::Failed));
        failed.spec.provider_id = Some("sim://failed".into());
        failed.status.as_mut().expect("status").last_operation = Some(LastOperation {
            state: Some(MachineState::Failed),
            description: Some("quota".into()),
            ..LastOperation::default()
        });
        let old = running("old");
        let st = status(&s, &[&old, &young, &failed], None, at(100));
        assert_eq!((st.ready_replicas, st.available_replicas), (2, 1));
        let failed = st.failed_machines.expect("failed machines");
        assert_eq!(failed[0].name.as_deref(), Some("failed"));
        assert_eq!(failed[0].provider_id.as_deref(), Some("sim://failed"));
    }

    /// MS-9: a failed create sets ReplicaFailure/FailedCreate; an error-free pass removes it.
    #[test]
    fn ms_9_replica_failure_comes_and_goes() {
        let mut s = set(10);
        let a = running("a");
        let st = status(&s, &[&a], Some("quota exceeded"), at(1));
        let c = st.conditions.clone().expect("conditions");
        assert_eq!(c[0].type_, MachineSetConditionType::ReplicaFailure);
        assert_eq!(c[0].reason.as_deref(), Some("FailedCreate"));
        assert_eq!(c[0].message.as_deref(), Some("quota exceeded"));
        s.status = Some(st);
        assert_eq!(status(&s, &[&a], None, at(2)).conditions, None);
    }

    /// MS-5: a Terminating Machine is not a replica to the diff, so one is created.
    #[test]
    fn ms_5_terminating_machines_are_replaced() {
        let a = running("a");
        let b = running("b");
        let t = machine("t", Some(MachinePhase::Terminating));
        assert_eq!(plan_replicas(&set(3), &[&a, &b, &t]).create, 1);
        assert_eq!(status(&set(3), &[&a, &b, &t], None, at(1)).replicas, 3);
    }

    /// MS-6 and MS-7: Failed Machines are deleted (once) and replaced on the next pass.
    #[test]
    fn ms_6_and_7_failed_machines_go() {
        let (a, b, c) = (running("a"), running("b"), running("c"));
        let f = machine("f", Some(MachinePhase::Failed));
        assert_eq!(plan_replicas(&set(3), &[&a, &b, &c, &f]).delete, ["f"]);
        assert_eq!(plan_replicas(&set(2), &[&a, &f]).delete, ["f"]);
    }

    /// MS-11 and MS-12: frozen or scale-up-disabled sets create nothing; a frozen one still deletes.
    #[test]
    fn ms_11_and_12_no_scale_up_when_frozen_or_disabled() {
        let a = running("a");
        let mut frozen = set(3);
        frozen.metadata.labels = Some(labels(&[(LABEL_FREEZE, "True")]));
        assert_eq!(plan_replicas(&frozen, &[&a]).create, 0);
        let mut disabled = set(3);
        disabled.metadata.labels = Some(labels(&[(LABEL_SCALE_UP_DISABLED, "")]));
        assert_eq!(plan_replicas(&disabled, &[&a]).create, 0);
        frozen.spec.replicas = 1;
        let (b, c) = (running("b"), running("c"));
        assert_eq!(plan_replicas(&frozen, &[&a, &b, &c]).delete.len(), 2);
    }

    /// MS-15: a Machine the autoscaler marked at or before the set's scaler change goes, even
    /// without a replica difference.
    #[test]
    fn ms_15_marked_machines_go_with_the_scaler_change() {
        let mut s = set(2);
        s.metadata.annotations = Some(labels(&[(
            ANNOTATION_SCALER_CHANGE,
            "2024-05-01T10:00:05Z",
        )]));
        let mark = |at: &str| {
            let mut m = with_priority(running("m"), "1");
            m.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(ANNOTATION_MARKED_FOR_DELETION.into(), at.into());
            m
        };
        let other = running("other");
        let early = mark("2024-05-01T10:00:00Z");
        assert_eq!(plan_replicas(&s, &[&early, &other]).delete, ["m"]);
        let late = mark("2024-05-01T10:00:10Z");
        assert!(plan_replicas(&s, &[&late, &other]).delete.is_empty());
    }

    #[test]
    fn machine_names_take_five_suffix_characters() {
        assert_eq!(machine_name("pool-a-1", 0), "pool-a-1-bbbbb");
        let name = machine_name("pool-a-1", u64::MAX);
        assert_eq!(name.len(), "pool-a-1-".len() + 5);
        assert_ne!(machine_name("s", 1), machine_name("s", 2));
    }

    #[test]
    fn selectors_are_validated_as_mcm_validates_a_set() {
        assert!(selector_of(&set(1)).is_ok());
        let mut empty = set(1);
        empty.spec.selector = Some(LabelSelector::default());
        assert_eq!(selector_of(&empty), Err(SetSelectorError::Empty));
        let mut elsewhere = set(1);
        elsewhere.spec.selector = Some(LabelSelector {
            match_labels: Some(labels(&[("name", "pool-b")])),
            match_expressions: None,
        });
        assert_eq!(
            selector_of(&elsewhere),
            Err(SetSelectorError::TemplateNotSelected)
        );
    }
}
