//! One MachineDeployment: the template hash and the sets it names, which set is new, revisions,
//! the status and conditions it reports, and the old sets its history limit removes (MCM's
//! `deployment_sync.go`, `deployment_util.go`, `deployment_progress.go`).

use std::collections::BTreeMap;

use capstan_apis::machine::{
    ANNOTATION_DESIRED_REPLICAS, ANNOTATION_MAX_REPLICAS, ANNOTATION_REVISION,
    ANNOTATION_REVISION_HISTORY, ConditionStatus, LABEL_TEMPLATE_HASH, MachineDeployment,
    MachineDeploymentCondition, MachineDeploymentConditionType, MachineDeploymentStatus,
    MachineSet, MachineSetSpec, MachineSummary, MachineTemplateSpec, StrategyType,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::Timestamp;
use crate::ownership::controller_ref;

/// Condition reasons and messages MCM writes (Kubernetes' deployment util, MachineSet for ReplicaSet).
pub mod reason {
    pub const NEW_MACHINE_SET_CREATED: &str = "NewMachineSetCreated";
    pub const FOUND_NEW_MACHINE_SET: &str = "FoundNewMachineSet";
    /// MCM's `FailedISCreateReason`: the reason of the Warning Event and of the condition.
    pub const MACHINE_SET_CREATE_ERROR: &str = "MachineSetCreateError";
    pub const MACHINE_SET_UPDATED: &str = "MachineSetUpdated";
    pub const NEW_MACHINE_SET_AVAILABLE: &str = "NewMachineSetAvailable";
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const PAUSED: &str = "DeploymentPaused";
    pub const RESUMED: &str = "DeploymentResumed";
    pub const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
    pub const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
}

/// FNV-1a, 32 bits: the hash MCM's `ComputeHash` uses.
fn fnv32a(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in bytes {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The `machine-template-hash` of a template: FNV-32a, in decimal as MCM writes the label, with
/// the collision count appended as MCM does (four little-endian bytes in an eight-byte buffer).
///
/// **Decision:** MCM hashes Go's `spew` dump of the template struct, which no other language can
/// reproduce; ours hashes the template's JSON (serde field order, maps sorted). Sets are matched
/// to a template by content (see [`is_new_set`]), never by hash, so sets MCM made are adopted as
/// they are and only a set Capstan creates carries a hash of ours.
pub fn template_hash(template: &MachineTemplateSpec, collision_count: Option<i32>) -> String {
    let mut bytes = serde_json::to_vec(template).unwrap_or_default();
    if let Some(count) = collision_count {
        let mut extra = [0u8; 8];
        extra[..4].copy_from_slice(&u32::from_ne_bytes(count.to_ne_bytes()).to_le_bytes());
        bytes.extend_from_slice(&extra);
    }
    fnv32a(&bytes).to_string()
}

/// Kubernetes' name-suffix alphabet: consonants and digits that spell no words, so a generated
/// suffix never reads as one (`rand.SafeEncodeString`, `generateName`).
pub(crate) const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Kubernetes' `rand.SafeEncodeString`: each byte mapped onto [`NAME_ALPHABET`].
pub fn safe_encode(s: &str) -> String {
    s.bytes()
        .map(|b| char::from(NAME_ALPHABET[usize::from(b) % NAME_ALPHABET.len()]))
        .collect()
}

/// The name MCM gives the set of a template hash: `<deployment>-` and the first five characters
/// of the safe-encoded hash.
pub fn set_name(deployment: &str, hash: &str) -> String {
    let suffix: String = safe_encode(hash).chars().take(5).collect();
    format!("{deployment}-{suffix}")
}

/// A template without the hash label, for comparing a set's template with the deployment's.
fn without_hash(template: &MachineTemplateSpec) -> MachineTemplateSpec {
    let mut t = template.clone();
    if let Some(meta) = t.metadata.as_mut() {
        if let Some(labels) = meta.labels.as_mut() {
            labels.remove(LABEL_TEMPLATE_HASH);
        }
        if meta.labels.as_ref().is_some_and(BTreeMap::is_empty) {
            meta.labels = None;
        }
    }
    t
}

/// True when `set` was made from the deployment's current template (`EqualIgnoreHash`).
pub fn is_new_set(deployment: &MachineDeployment, set: &MachineSet) -> bool {
    set.spec
        .template
        .as_ref()
        .is_some_and(|t| without_hash(t) == without_hash(&deployment.spec.template))
}

/// The set made from the current template: the oldest such, if several (`FindNewMachineSet`).
pub fn find_new_set<'a>(
    deployment: &MachineDeployment,
    sets: &[&'a MachineSet],
) -> Option<&'a MachineSet> {
    let mut candidates: Vec<&MachineSet> = sets
        .iter()
        .copied()
        .filter(|s| is_new_set(deployment, s))
        .collect();
    candidates.sort_by(|a, b| {
        created(a)
            .cmp(&created(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    candidates.first().copied()
}

/// A set's creation time (the epoch when it has none yet).
pub fn created(set: &MachineSet) -> Timestamp {
    set.metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

/// The `deployment.kubernetes.io/revision` of an object, 0 when absent or unparsable.
pub fn revision(meta: &ObjectMeta) -> i64 {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REVISION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// The revision a new set gets: one past the highest of the old sets.
pub fn next_revision(old: &[&MachineSet]) -> i64 {
    old.iter().map(|s| revision(&s.metadata)).max().unwrap_or(0) + 1
}

/// Deployment annotations MCM never copies onto its sets.
const NOT_COPIED: [&str; 7] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    ANNOTATION_REVISION,
    ANNOTATION_REVISION_HISTORY,
    ANNOTATION_DESIRED_REPLICAS,
    ANNOTATION_MAX_REPLICAS,
    "deployment.machine.sapcloud.io/prefer-no-schedule",
    crate::safety::ANNOTATION_UNFREEZE,
];

/// The annotations a deployment's set carries: the deployment's own (but not [`NOT_COPIED`]), its
/// revision, and the replica numbers
/// it was last scaled for.
pub fn set_annotations(
    deployment: &MachineDeployment,
    existing: Option<&BTreeMap<String, String>>,
    revision: i64,
    max_surge: i32,
) -> BTreeMap<String, String> {
    let mut annotations = existing.cloned().unwrap_or_default();
    for (k, v) in deployment.metadata.annotations.iter().flatten() {
        if NOT_COPIED.contains(&k.as_str()) {
            continue;
        }
        annotations.insert(k.clone(), v.clone());
    }
    let previous = annotations.get(ANNOTATION_REVISION).cloned();
    let revision = revision.to_string();
    if let Some(previous) = previous.filter(|p| *p != revision) {
        // The same template came back: its earlier revision joins the history.
        let history = match annotations.get(ANNOTATION_REVISION_HISTORY) {
            Some(h) if !h.is_empty() => format!("{h},{previous}"),
            _ => previous,
        };
        annotations.insert(ANNOTATION_REVISION_HISTORY.into(), history);
    }
    annotations.insert(ANNOTATION_REVISION.into(), revision);
    let desired = deployment.spec.replicas;
    annotations.insert(ANNOTATION_DESIRED_REPLICAS.into(), desired.to_string());
    annotations.insert(
        ANNOTATION_MAX_REPLICAS.into(),
        (desired + max_surge).to_string(),
    );
    annotations
}

/// The MachineSet a deployment creates for its current template, at `replicas`.
pub fn new_set(
    deployment: &MachineDeployment,
    hash: &str,
    revision: i64,
    replicas: i32,
    max_surge: i32,
) -> MachineSet {
    let name = deployment.metadata.name.clone().unwrap_or_default();
    let mut template = deployment.spec.template.clone();
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_TEMPLATE_HASH.into(), hash.into());
    let labels = meta.labels.clone();
    let mut selector = deployment.spec.selector.clone().unwrap_or_default();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_TEMPLATE_HASH.into(), hash.into());
    let machine_class = template.spec.as_ref().and_then(|s| s.class.clone());
    let mut set = MachineSet::new(
        &set_name(&name, hash),
        MachineSetSpec {
            replicas,
            selector: Some(selector),
            machine_class,
            template: Some(template),
            min_ready_seconds: deployment.spec.min_ready_seconds,
            auto_preserve_failed_machine_max: None,
        },
    );
    set.metadata.namespace = deployment.metadata.namespace.clone();
    set.metadata.labels = labels;
    set.metadata.annotations = Some(set_annotations(deployment, None, revision, max_surge));
    set.metadata.owner_references = Some(vec![controller_ref(
        "MachineDeployment",
        &name,
        deployment.metadata.uid.as_deref().unwrap_or_default(),
    )]);
    set
}

/// What a deprecated `spec.rollbackTo` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Rollback {
    /// Copy this template (hash label removed) into the deployment: the revision it came from.
    To {
        revision: i64,
        template: Box<MachineTemplateSpec>,
    },
    /// The revision's template is the deployment's already.
    Unchanged { revision: i64 },
    /// No set has that revision (0: no previous revision).
    NotFound { wanted: i64 },
}

/// MCM's rollback: revision 0 means the revision before the newest; the deployment takes that
/// set's template unless it already has it. `None` without `rollbackTo`.
pub fn rollback(deployment: &MachineDeployment, sets: &[&MachineSet]) -> Option<Rollback> {
    let wanted = deployment.spec.rollback_to.as_ref()?.revision;
    let mut revisions: Vec<(i64, &MachineSet)> = sets
        .iter()
        .map(|s| (revision(&s.metadata), *s))
        .filter(|(r, _)| *r > 0)
        .collect();
    revisions.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
    let target = if wanted == 0 {
        revisions.get(1)
    } else {
        revisions.iter().find(|(r, _)| *r == wanted)
    };
    let Some((revision, set)) = target else {
        return Some(Rollback::NotFound { wanted });
    };
    let template = set
        .spec
        .template
        .clone()
        .map(|t| without_hash(&t))
        .unwrap_or_default();
    if template == without_hash(&deployment.spec.template) {
        return Some(Rollback::Unchanged {
            revision: *revision,
        });
    }
    Some(Rollback::To {
        revision: *revision,
        template: Box::new(template),
    })
}

/// The strategy a deployment names (`RollingUpdate` when unset or unknown).
pub fn strategy(deployment: &MachineDeployment) -> StrategyType {
    match deployment
        .spec
        .strategy
        .as_ref()
        .and_then(|s| s.type_.clone())
    {
        Some(StrategyType::Recreate) => StrategyType::Recreate,
        _ => StrategyType::RollingUpdate,
    }
}

/// The Machine counts of one set, counted from its Machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MachineCounts {
    /// Every Machine of the set, Terminating included (MCM's `status.replicas`).
    pub existing: i32,
    /// Not being deleted.
    pub live: i32,
    pub ready: i32,
    pub available: i32,
}

impl MachineCounts {
    /// Every Machine of a set of `replicas` exists, none is going and all are available: nothing
    /// about the set is about to change.
    pub fn settled(&self, replicas: i32) -> bool {
        self.existing == replicas && self.live == replicas && self.available == replicas
    }
}

/// Everything a deployment's status is computed from.
pub struct Observed<'a> {
    /// The new set's name and counts, if it exists.
    pub new: Option<(&'a str, MachineCounts)>,
    /// True when this pass created the new set.
    pub created_new: bool,
    /// Every set's counts (the new one included).
    pub all: &'a [MachineCounts],
    pub failed: Vec<MachineSummary>,
    pub max_unavailable: i32,
    pub now: Timestamp,
}

fn condition<'a>(
    status: &'a MachineDeploymentStatus,
    type_: &MachineDeploymentConditionType,
) -> Option<&'a MachineDeploymentCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| &c.type_ == type_)
}

/// Sets a condition, keeping `lastTransitionTime` when the status did not change and both
/// times when nothing did (so an idle pass writes nothing).
fn set_condition(
    status: &mut MachineDeploymentStatus,
    type_: MachineDeploymentConditionType,
    value: ConditionStatus,
    reason: &str,
    message: String,
    now: Timestamp,
) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status == value
            && existing.reason.as_deref() == Some(reason)
            && existing.message.as_deref() == Some(message.as_str())
        {
            return;
        }
        if existing.status != value {
            existing.last_transition_time = Some(Time(now));
        }
        existing.status = value;
        existing.reason = Some(reason.into());
        existing.message = Some(message);
        existing.last_update_time = Some(Time(now));
        return;
    }
    conditions.push(MachineDeploymentCondition {
        type_,
        status: value,
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
        reason: Some(reason.into()),
        message: Some(message),
    });
}

fn elapsed_secs(since: Option<&Time>, now: Timestamp) -> i64 {
    since.map_or(0, |t| (now.as_second() - t.0.as_second()).max(0))
}

/// The deployment's status after this pass: counts over its sets' Machines, the Available
/// condition against `replicas - maxUnavailable`, and the Progressing condition with MCM's
/// reasons (deadline only when `progressDeadlineSeconds` is set; none while paused).
pub fn status(deployment: &MachineDeployment, observed: &Observed<'_>) -> MachineDeploymentStatus {
    let previous = deployment.status.clone().unwrap_or_default();
    let sum = |f: fn(&MachineCounts) -> i32| observed.all.iter().map(f).sum::<i32>();
    let desired = deployment.spec.replicas;
    let available = sum(|c| c.available);
    let mut status = MachineDeploymentStatus {
        observed_generation: deployment.metadata.generation.unwrap_or(0),
        replicas: sum(|c| c.live),
        updated_replicas: observed.new.map_or(0, |(_, c)| c.live),
        ready_replicas: sum(|c| c.ready),
        available_replicas: available,
        unavailable_replicas: (desired - available).max(0),
        conditions: previous.conditions.clone(),
        collision_count: previous.collision_count,
        failed_machines: (!observed.failed.is_empty()).then(|| observed.failed.clone()),
    };
    let now = observed.now;
    if available >= desired - observed.max_unavailable {
        set_condition(
            &mut status,
            MachineDeploymentConditionType::Available,
            ConditionStatus::True,
            reason::MINIMUM_REPLICAS_AVAILABLE,
            "Deployment has minimum availability.".into(),
            now,
        );
    } else {
        set_condition(
            &mut status,
            MachineDeploymentConditionType::Available,
            ConditionStatus::False,
            reason::MINIMUM_REPLICAS_UNAVAILABLE,
            "Deployment does not have minimum availability.".into(),
            now,
        );
    }
    progressing(deployment, observed, &previous, &mut status);
    status
}

/// Kubernetes' `syncRolloutStatus`, as MCM copied it: nothing without a progress deadline;
/// Unknown while paused; then complete, progressing (a count moved the right way since the last
/// status), or timed out (no progress for longer than the deadline).
fn progressing(
    deployment: &MachineDeployment,
    observed: &Observed<'_>,
    previous: &MachineDeploymentStatus,
    status: &mut MachineDeploymentStatus,
) {
    let Some(deadline) = deployment.spec.progress_deadline_seconds else {
        return;
    };
    let now = observed.now;
    let progressing = || MachineDeploymentConditionType::Progressing;
    if deployment.spec.paused {
        set_condition(
            status,
            progressing(),
            ConditionStatus::Unknown,
            reason::PAUSED,
            "Deployment is paused".into(),
            now,
        );
        return;
    }
    let name = observed.new.map(|(n, _)| n).unwrap_or_default();
    let current = condition(status, &progressing()).cloned();
    if current
        .as_ref()
        .is_some_and(|c| c.reason.as_deref() == Some(reason::PAUSED))
    {
        set_condition(
            status,
            progressing(),
            ConditionStatus::Unknown,
            reason::RESUMED,
            "Deployment is resumed".into(),
            now,
        );
    }
    if observed.created_new {
        set_condition(
            status,
            progressing(),
            ConditionStatus::True,
            reason::NEW_MACHINE_SET_CREATED,
            format!("Created new machine set \"{name}\""),
            now,
        );
        return;
    }
    if current.is_none() && observed.new.is_some() {
        // Progress was not tracked before (a deadline newly set, or a deployment MCM made):
        // this pass is the first sight of its new set, as `getNewMachineSet` records it.
        set_condition(
            status,
            progressing(),
            ConditionStatus::True,
            reason::FOUND_NEW_MACHINE_SET,
            format!("Found new machine set \"{name}\""),
            now,
        );
    }
    let desired = deployment.spec.replicas;
    let complete = status.updated_replicas == desired
        && status.replicas == desired
        && status.available_replicas == desired;
    let moved = status.updated_replicas > previous.updated_replicas
        || status.replicas < previous.replicas
        || status.ready_replicas > previous.ready_replicas
        || status.available_replicas > previous.available_replicas;
    if complete {
        set_condition(
            status,
            progressing(),
            ConditionStatus::True,
            reason::NEW_MACHINE_SET_AVAILABLE,
            format!("MachineSet \"{name}\" has successfully progressed."),
            now,
        );
    } else if moved {
        set_condition(
            status,
            progressing(),
            ConditionStatus::True,
            reason::MACHINE_SET_UPDATED,
            format!("MachineSet \"{name}\" is progressing."),
            now,
        );
    } else if let Some(current) = condition(status, &progressing()).cloned() {
        let settled = [
            reason::NEW_MACHINE_SET_AVAILABLE,
            reason::PROGRESS_DEADLINE_EXCEEDED,
        ];
        if !settled.contains(&current.reason.as_deref().unwrap_or_default())
            && elapsed_secs(current.last_update_time.as_ref(), now) > i64::from(deadline)
        {
            set_condition(
                status,
                progressing(),
                ConditionStatus::False,
                reason::PROGRESS_DEADLINE_EXCEEDED,
                format!("MachineSet \"{name}\" has timed out progressing."),
                now,
            );
        }
    }
}

/// The message of a failed create of the new set (MCM's, with the API error), for the Warning
/// Event and the condition.
pub fn create_failed_message(set_name: &str, error: &str) -> String {
    format!("Failed to create new machine set \"{set_name}\": {error}")
}

/// The status to write after the new set could not be created: `Progressing False
/// MachineSetCreateError` with [`create_failed_message`]. `None` without a progress deadline
/// (MCM records the condition only then; the Warning Event is published either way).
pub fn create_failed(
    deployment: &MachineDeployment,
    message: &str,
    now: Timestamp,
) -> Option<MachineDeploymentStatus> {
    deployment.spec.progress_deadline_seconds?;
    let mut status = deployment.status.clone().unwrap_or_default();
    set_condition(
        &mut status,
        MachineDeploymentConditionType::Progressing,
        ConditionStatus::False,
        reason::MACHINE_SET_CREATE_ERROR,
        message.to_owned(),
        now,
    );
    Some(status)
}

/// Old sets past `revisionHistoryLimit` that can go: scaled to 0 with no Machines left, the
/// oldest first (`cleanupDeployment`). Without a limit MCM keeps every old set.
pub fn history_to_delete(
    deployment: &MachineDeployment,
    old: &[(&MachineSet, MachineCounts)],
) -> Vec<String> {
    let Some(limit) = deployment.spec.revision_history_limit else {
        return Vec::new();
    };
    let limit = limit.max(0);
    let mut idle: Vec<&MachineSet> = old
        .iter()
        .filter(|(s, c)| {
            s.spec.replicas == 0 && c.existing == 0 && s.metadata.deletion_timestamp.is_none()
        })
        .map(|(s, _)| *s)
        .collect();
    let excess = idle
        .len()
        .saturating_sub(usize::try_from(limit).unwrap_or(0));
    idle.sort_by(|a, b| {
        created(a)
            .cmp(&created(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    idle.into_iter()
        .take(excess)
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use capstan_apis::machine::{ClassSpec, MachineDeploymentSpec, MachineSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    fn template(class: &str) -> MachineTemplateSpec {
        MachineTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([("name".into(), "pool-a".into())])),
                ..ObjectMeta::default()
            }),
            spec: Some(MachineSpec {
                class: Some(ClassSpec {
                    api_group: None,
                    kind: Some("MachineClass".into()),
                    name: Some(class.into()),
                }),
                ..MachineSpec::default()
            }),
        }
    }

    fn deployment(class: &str, replicas: i32) -> MachineDeployment {
        let mut d = MachineDeployment::new(
            "pool-a",
            MachineDeploymentSpec {
                replicas,
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("name".into(), "pool-a".into())])),
                    match_expressions: None,
                }),
                template: template(class),
                progress_deadline_seconds: Some(600),
                ..MachineDeploymentSpec::default()
            },
        );
        d.metadata.namespace = Some("ns".into());
        d.metadata.uid = Some("d-uid".into());
        d.metadata.generation = Some(2);
        d
    }

    #[test]
    fn the_hash_is_stable_and_changes_with_the_template_and_collisions() {
        let a = template("c1");
        assert_eq!(template_hash(&a, None), template_hash(&a.clone(), None));
        assert_ne!(
            template_hash(&a, None),
            template_hash(&template("c2"), None)
        );
        assert_ne!(template_hash(&a, None), template_hash(&a, Some(1)));
        assert!(template_hash(&a, None).bytes().all(|b| b.is_ascii_digit()));
    }

    #[test]
    fn safe_encoding_uses_kubernetes_alphabet() {
        // '0' is byte 48: 48 % 27 = 21 -> '4'; '1' -> 49 % 27 = 22 -> '5'.
        assert_eq!(safe_encode("01"), "45");
        assert_eq!(set_name("pool-a", "01"), "pool-a-45");
    }

    /// docs/machineset.md MD-13.
    #[test]
    fn md_13_the_set_name_takes_five_encoded_characters() {
        assert_eq!(set_name("pool-a", "1234567890"), "pool-a-56789");
    }

    #[test]
    fn the_new_set_carries_the_hash_revision_and_owner() {
        let d = deployment("c1", 3);
        let hash = template_hash(&d.spec.template, None);
        let set = new_set(&d, &hash, 4, 1, 1);
        assert_eq!(set.metadata.name, Some(set_name("pool-a", &hash)));
        assert_eq!(set.metadata.namespace.as_deref(), Some("ns"));
        let labels = set.metadata.labels.clone().expect("labels");
        assert_eq!(labels.get(LABEL_TEMPLATE_HASH), Some(&hash));
        let selector = set.spec.selector.clone().expect("selector");
        assert_eq!(
            selector
                .match_labels
                .expect("labels")
                .get(LABEL_TEMPLATE_HASH),
            Some(&hash)
        );
        let annotations = set.metadata.annotations.clone().expect("annotations");
        assert_eq!(annotations[ANNOTATION_REVISION], "4");
        assert_eq!(annotations[ANNOTATION_DESIRED_REPLICAS], "3");
        assert_eq!(annotations[ANNOTATION_MAX_REPLICAS], "4");
        let owner = &set.metadata.owner_references.clone().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("MachineDeployment", "d-uid")
        );
        assert_eq!(set.spec.replicas, 1);
        assert_eq!(
            set.spec
                .machine_class
                .clone()
                .and_then(|c| c.name)
                .as_deref(),
            Some("c1")
        );
        // Its template, hash label and all, is the deployment's template.
        assert!(is_new_set(&d, &set));
        assert!(!is_new_set(&deployment("c2", 3), &set));
    }

    #[test]
    fn revisions_count_up_and_a_returning_template_keeps_its_history() {
        let d = deployment("c1", 3);
        let mut one = new_set(&d, "1", 1, 0, 1);
        let two = new_set(&deployment("c2", 3), "2", 2, 0, 1);
        assert_eq!(next_revision(&[&one, &two]), 3);
        // Back to c1: its set becomes revision 3 and remembers it was 1.
        let annotations = set_annotations(&d, one.metadata.annotations.as_ref(), 3, 1);
        assert_eq!(annotations[ANNOTATION_REVISION], "3");
        assert_eq!(annotations[ANNOTATION_REVISION_HISTORY], "1");
        one.metadata.annotations = Some(annotations);
        let again = set_annotations(&d, one.metadata.annotations.as_ref(), 5, 1);
        assert_eq!(again[ANNOTATION_REVISION_HISTORY], "1,3");
    }

    #[test]
    fn the_oldest_set_of_the_template_is_the_new_one() {
        let d = deployment("c1", 3);
        let mut first = new_set(&d, "1", 1, 0, 1);
        first.metadata.creation_timestamp = Some(Time(at(5)));
        let mut second = new_set(&d, "2", 2, 0, 1);
        second.metadata.name = Some("pool-a-other".into());
        second.metadata.creation_timestamp = Some(Time(at(1)));
        let other = new_set(&deployment("c2", 3), "3", 3, 0, 1);
        let found = find_new_set(&d, &[&first, &other, &second]).expect("found");
        assert_eq!(found.metadata.name.as_deref(), Some("pool-a-other"));
        assert!(find_new_set(&d, &[&other]).is_none());
    }

    fn counts(live: i32, ready: i32, available: i32) -> MachineCounts {
        MachineCounts {
            existing: live,
            live,
            ready,
            available,
        }
    }

    fn progressing(status: &MachineDeploymentStatus) -> MachineDeploymentCondition {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == MachineDeploymentConditionType::Progressing)
            .cloned()
            .expect("progressing")
    }

    #[test]
    fn a_new_set_first_seen_without_progress_tracked_is_found() {
        let mut d = deployment("c1", 3);
        // The counts the status already holds: nothing moved, nothing complete.
        d.status = Some(MachineDeploymentStatus {
            replicas: 4,
            updated_replicas: 1,
            ready_replicas: 3,
            available_replicas: 3,
            ..MachineDeploymentStatus::default()
        });
        let all = [counts(3, 3, 3), counts(1, 0, 0)];
        let observed = Observed {
            new: Some(("pool-a-new", all[1])),
            created_new: false,
            all: &all,
            failed: vec![],
            max_unavailable: 0,
            now: at(100),
        };
        let p = progressing(&status(&d, &observed));
        assert_eq!(
            (p.status, p.reason.as_deref(), p.message.as_deref()),
            (
                ConditionStatus::True,
                Some(reason::FOUND_NEW_MACHINE_SET),
                Some("Found new machine set \"pool-a-new\"")
            )
        );
        // Without a progress deadline MCM tracks no progress at all.
        d.spec.progress_deadline_seconds = None;
        assert!(
            status(&d, &observed)
                .conditions
                .iter()
                .flatten()
                .all(|c| c.type_ != MachineDeploymentConditionType::Progressing)
        );
    }

    #[test]
    fn a_failed_create_of_the_new_set_is_progressing_false_with_the_api_error() {
        let d = deployment("c1", 3);
        let message = create_failed_message("pool-a-1a2b3", "admission webhook denied the request");
        assert_eq!(
            message,
            "Failed to create new machine set \"pool-a-1a2b3\": admission webhook denied the request"
        );
        let st = create_failed(&d, &message, at(100)).expect("a deadline is set");
        let p = progressing(&st);
        assert_eq!(
            (p.status, p.reason.as_deref(), p.message.as_deref()),
            (
                ConditionStatus::False,
                Some(reason::MACHINE_SET_CREATE_ERROR),
                Some(message.as_str())
            )
        );
        let mut no_deadline = d;
        no_deadline.spec.progress_deadline_seconds = None;
        assert!(create_failed(&no_deadline, &message, at(100)).is_none());
    }

    #[test]
    fn status_and_conditions_through_a_roll() {
        let mut d = deployment("c1", 3);
        let all = [counts(3, 3, 3), counts(1, 0, 0)];
        let observed = Observed {
            new: Some(("pool-a-new", all[1])),
            created_new: true,
            all: &all,
            failed: vec![],
            max_unavailable: 0,
            now: at(100),
        };
        let st = status(&d, &observed);
        assert_eq!(
            (
                st.replicas,
                st.updated_replicas,
                st.ready_replicas,
                st.available_replicas,
                st.unavailable_replicas
            ),
            (4, 1, 3, 3, 0)
        );
        assert_eq!(st.observed_generation, 2);
        let p = progressing(&st);
        assert_eq!(p.reason.as_deref(), Some(reason::NEW_MACHINE_SET_CREATED));
        assert_eq!(
            p.message.as_deref(),
            Some("Created new machine set \"pool-a-new\"")
        );
        d.status = Some(st);

        // The new Machine becomes available: progressing.
        let all = [counts(3, 3, 3), counts(1, 1, 1)];
        let observed = Observed {
            new: Some(("pool-a-new", all[1])),
            created_new: false,
            all: &all,
            failed: vec![],
            max_unavailable: 0,
            now: at(200),
        };
        let st = status(&d, &observed);
        assert_eq!(
            progressing(&st).reason.as_deref(),
            Some(reason::MACHINE_SET_UPDATED)
        );
        d.status = Some(st);

        // Nothing moves for longer than the deadline: exceeded, False.
        let observed = Observed {
            now: at(900),
            ..observed
        };
        let st = status(&d, &observed);
        let p = progressing(&st);
        assert_eq!(
            p.reason.as_deref(),
            Some(reason::PROGRESS_DEADLINE_EXCEEDED)
        );
        assert_eq!(p.status, ConditionStatus::False);
        assert_eq!(
            p.message.as_deref(),
            Some("MachineSet \"pool-a-new\" has timed out progressing.")
        );

        // Done: old at 0, new at 3 available.
        let all = [counts(0, 0, 0), counts(3, 3, 3)];
        let observed = Observed {
            new: Some(("pool-a-new", all[1])),
            created_new: false,
            all: &all,
            failed: vec![],
            max_unavailable: 0,
            now: at(1000),
        };
        let st = status(&d, &observed);
        let p = progressing(&st);
        assert_eq!(p.reason.as_deref(), Some(reason::NEW_MACHINE_SET_AVAILABLE));
        assert_eq!(p.status, ConditionStatus::True);
        let available = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == MachineDeploymentConditionType::Available)
            .expect("available");
        assert_eq!(
            available.reason.as_deref(),
            Some(reason::MINIMUM_REPLICAS_AVAILABLE)
        );
    }

    #[test]
    fn an_idle_pass_changes_no_condition() {
        let mut d = deployment("c1", 3);
        let all = [counts(3, 3, 3)];
        let observed = Observed {
            new: Some(("pool-a-new", all[0])),
            created_new: false,
            all: &all,
            failed: vec![],
            max_unavailable: 1,
            now: at(100),
        };
        let st = status(&d, &observed);
        d.status = Some(st.clone());
        let later = Observed {
            now: at(5000),
            ..observed
        };
        assert_eq!(status(&d, &later), st);
    }

    #[test]
    fn history_keeps_only_sets_without_machines() {
        let mut d = deployment("c1", 3);
        d.spec.revision_history_limit = Some(1);
        let mk = |name: &str, created: i64, replicas: i32| {
            let mut s = new_set(&d, name, 1, replicas, 1);
            s.metadata.name = Some(name.into());
            s.metadata.creation_timestamp = Some(Time(at(created)));
            s
        };
        let oldest = mk("oldest", 1, 0);
        let older = mk("older", 2, 0);
        let busy = mk("busy", 0, 2);
        let draining = mk("draining", 0, 0);
        let old = [
            (&older, counts(0, 0, 0)),
            (&oldest, counts(0, 0, 0)),
            (&busy, counts(2, 2, 2)),
            (&draining, counts(1, 1, 1)),
        ];
        assert_eq!(history_to_delete(&d, &old), ["oldest"]);
    }

    /// docs/machineset.md MD-12: revisions 1, 2, 3; back to v1 makes S1 revision 4 with history 1.
    #[test]
    fn md_12_revisions_and_history() {
        let v1 = deployment("c1", 3);
        let s1 = new_set(&v1, "1", next_revision(&[]), 0, 1);
        assert_eq!(revision(&s1.metadata), 1);
        let s2 = new_set(&deployment("c2", 3), "2", next_revision(&[&s1]), 0, 1);
        let s3 = new_set(&deployment("c3", 3), "3", next_revision(&[&s1, &s2]), 0, 1);
        assert_eq!(revision(&s3.metadata), 3);
        let back = set_annotations(
            &v1,
            s1.metadata.annotations.as_ref(),
            next_revision(&[&s2, &s3]),
            1,
        );
        assert_eq!(back[ANNOTATION_REVISION], "4");
        assert_eq!(back[ANNOTATION_REVISION_HISTORY], "1");
    }

    /// MD-14: no progress for longer than the deadline times out.
    #[test]
    fn md_14_deadline_exceeded() {
        let mut d = deployment("c1", 3);
        let mut before = MachineDeploymentStatus {
            replicas: 4,
            updated_replicas: 1,
            ready_replicas: 3,
            available_replicas: 3,
            ..MachineDeploymentStatus::default()
        };
        set_condition(
            &mut before,
            MachineDeploymentConditionType::Progressing,
            ConditionStatus::True,
            reason::MACHINE_SET_UPDATED,
            "MachineSet \"pool-a-new\" is progressing.".into(),
            at(0),
        );
        d.status = Some(before);
        let all = [counts(3, 3, 3), counts(1, 0, 0)];
        let observe = |now| Observed {
            new: Some(("pool-a-new", all[1])),
            created_new: false,
            all: &all,
            failed: vec![],
            max_unavailable: 0,
            now,
        };
        // 3 minutes in: still progressing as far as the deadline (600 s) goes.
        assert_eq!(
            progressing(&status(&d, &observe(at(180))))
                .reason
                .as_deref(),
            Some(reason::MACHINE_SET_UPDATED)
        );
        // 11 minutes in: exceeded.
        let p = progressing(&status(&d, &observe(at(660))));
        assert_eq!(
            (p.status, p.reason.as_deref()),
            (
                ConditionStatus::False,
                Some(reason::PROGRESS_DEADLINE_EXCEEDED)
            )
        );
    }

    /// MD-15: available 7 of 10 with maxUnavailable 2 is below the minimum.
    #[test]
    fn md_15_minimum_availability() {
        let d = deployment("c1", 10);
        let all = [counts(10, 7, 7)];
        let observed = Observed {
            new: Some(("pool-a-new", all[0])),
            created_new: false,
            all: &all,
            failed: vec![],
            max_unavailable: 2,
            now: at(1),
        };
        let st = status(&d, &observed);
        let available = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == MachineDeploymentConditionType::Available)
            .expect("available");
        assert_eq!(
            (
                available.status.clone(),
                available.reason.as_deref(),
                available.message.as_deref()
            ),
            (
                ConditionStatus::False,
                Some(reason::MINIMUM_REPLICAS_UNAVAILABLE),
                Some("Deployment does not have minimum availability.")
            )
        );
        assert_eq!(st.unavailable_replicas, 3);
    }

    /// MD-16: limit 1 and three idle old sets: the two oldest go; a busy one is kept. No limit
    /// keeps everything.
    #[test]
    fn md_16_history_limit() {
        let mut d = deployment("c1", 3);
        let mk = |name: &str, created: i64| {
            let mut s = new_set(&d, name, 1, 0, 1);
            s.metadata.name = Some(name.into());
            s.metadata.creation_timestamp = Some(Time(at(created)));
            s
        };
        let (a, b, c) = (mk("a", 1), mk("b", 2), mk("c", 3));
        let idle = counts(0, 0, 0);
        assert!(history_to_delete(&d, &[(&a, idle), (&b, idle), (&c, idle)]).is_empty());
        d.spec.revision_history_limit = Some(1);
        assert_eq!(
            history_to_delete(&d, &[(&c, idle), (&a, idle), (&b, idle)]),
            ["a", "b"]
        );
        let busy = counts(1, 1, 1);
        assert_eq!(
            history_to_delete(&d, &[(&a, busy), (&b, idle), (&c, idle)]),
            ["b"]
        );
    }

    /// MD-17: paused, then resumed.
    #[test]
    fn md_17_paused_then_resumed() {
        let mut d = deployment("c1", 3);
        d.spec.paused = true;
        let all = [counts(3, 3, 3)];
        let observed = Observed {
            new: Some(("pool-a-new", all[0])),
            created_new: false,
            all: &all,
            failed: vec![],
            max_unavailable: 1,
            now: at(1),
        };
        let paused = status(&d, &observed);
        let p = progressing(&paused);
        assert_eq!(
            (p.status.clone(), p.reason.as_deref(), p.message.as_deref()),
            (
                ConditionStatus::Unknown,
                Some(reason::PAUSED),
                Some("Deployment is paused")
            )
        );
        d.spec.paused = false;
        d.status = Some(paused);
        // Resumed and, its Machines all there, done in the same pass.
        let resumed = status(
            &d,
            &Observed {
                now: at(2),
                ..observed
            },
        );
        assert_eq!(
            progressing(&resumed).reason.as_deref(),
            Some(reason::NEW_MACHINE_SET_AVAILABLE)
        );
    }

    #[test]
    fn annotations_mcm_never_copies_stay_off_the_set() {
        let mut d = deployment("c1", 3);
        d.metadata.annotations = Some(BTreeMap::from([
            ("team".to_owned(), "a".to_owned()),
            (
                crate::safety::ANNOTATION_UNFREEZE.to_owned(),
                "x".to_owned(),
            ),
            (ANNOTATION_REVISION.to_owned(), "9".to_owned()),
        ]));
        let annotations = set_annotations(&d, None, 1, 1);
        assert_eq!(annotations.get("team").map(String::as_str), Some("a"));
        assert!(!annotations.contains_key(crate::safety::ANNOTATION_UNFREEZE));
        assert_eq!(annotations[ANNOTATION_REVISION], "1");
    }

    /// docs/machineset.md MD-21: `rollbackTo.revision 0` goes to the revision before the newest.
    #[test]
    fn md_21_rollback_to_the_previous_revision() {
        let mut d = deployment("c3", 3);
        let s1 = new_set(&deployment("c1", 3), "1", 1, 0, 1);
        let s2 = new_set(&deployment("c2", 3), "2", 2, 0, 1);
        let s3 = new_set(&deployment("c3", 3), "3", 3, 3, 1);
        assert_eq!(rollback(&d, &[&s1, &s2, &s3]), None);
        d.spec.rollback_to = Some(capstan_apis::machine::RollbackConfig { revision: 0 });
        match rollback(&d, &[&s1, &s3, &s2]) {
            Some(Rollback::To { revision, template }) => {
                assert_eq!(revision, 2);
                assert_eq!(*template, deployment("c2", 3).spec.template);
            }
            other => panic!("{other:?}"),
        }
        d.spec.rollback_to = Some(capstan_apis::machine::RollbackConfig { revision: 3 });
        assert_eq!(
            rollback(&d, &[&s1, &s2, &s3]),
            Some(Rollback::Unchanged { revision: 3 })
        );
        d.spec.rollback_to = Some(capstan_apis::machine::RollbackConfig { revision: 9 });
        assert_eq!(rollback(&d, &[&s1]), Some(Rollback::NotFound { wanted: 9 }));
    }
}
