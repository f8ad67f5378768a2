//! The cluster-autoscaler's deletion path through a MachineDeployment (MCM's
//! `node.machine.sapcloud.io/trigger-deletion-by-mcm`): the autoscaler names the Machines it wants
//! gone on the deployment, then lowers its replicas. The deployment marks those Machines (priority
//! `"1"` and the time of the mark) and stamps the scaler's change time; the set then deletes marked
//! Machines first (`set::plan_replicas`).

use std::collections::BTreeMap;

use crate::Timestamp;

/// Deployment annotation: `name~RFC3339,name2~RFC3339` the autoscaler wants removed.
pub const ANNOTATION_TRIGGER_DELETION: &str = "node.machine.sapcloud.io/trigger-deletion-by-mcm";

/// What one named Machine is, for the autoscaler path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// No Machine of that name.
    Missing,
    /// Failed or being deleted: nothing to mark.
    Going,
    /// A Machine to mark; `marked` when it already carries a mark time.
    Live { marked: bool },
}

/// What to write.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TriggerPlan {
    /// Deployment annotations to set (`Some`) or remove (`None`).
    pub deployment_annotations: BTreeMap<String, Option<String>>,
    /// Machines to mark: name, and the mark time to write when it has none.
    pub marks: Vec<(String, Option<String>)>,
}

/// MCM's pass over the trigger annotation. Without a scaler time yet, the scaler time becomes
/// `now` and entries without a time get it (a first pass writes only that). Then each entry
/// `name~time` whose time does not parse, whose Machine is missing or going is dropped from the
/// annotation (removed when empty); the others are marked.
pub fn plan(
    trigger: Option<&str>,
    scaler_time: Option<&str>,
    now: Timestamp,
    machine: impl Fn(&str) -> Named,
) -> TriggerPlan {
    let mut plan = TriggerPlan::default();
    let Some(trigger) = trigger.filter(|t| !t.trim().is_empty()) else {
        return plan;
    };
    let entries: Vec<&str> = trigger
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if scaler_time.is_none() {
        let stamp = now.to_string();
        let stamped: Vec<String> = entries
            .iter()
            .map(|e| {
                if e.contains('~') {
                    (*e).to_owned()
                } else {
                    format!("{e}~{stamp}")
                }
            })
            .collect();
        plan.deployment_annotations
            .insert(crate::set::ANNOTATION_SCALER_CHANGE.to_owned(), Some(stamp));
        plan.deployment_annotations.insert(
            ANNOTATION_TRIGGER_DELETION.to_owned(),
            Some(stamped.join(",")),
        );
        // The marks follow on the next pass, over the stamped entries.
        return plan;
    }
    let mut kept = Vec::new();
    for entry in &entries {
        let Some((name, time)) = entry.split_once('~') else {
            continue;
        };
        if time.parse::<Timestamp>().is_err() {
            continue;
        }
        match machine(name) {
            Named::Missing | Named::Going => {}
            Named::Live { marked } => {
                kept.push(*entry);
                plan.marks
                    .push((name.to_owned(), (!marked).then(|| time.to_owned())));
            }
        }
    }
    if kept.len() != entries.len() {
        let value = (!kept.is_empty()).then(|| kept.join(","));
        plan.deployment_annotations
            .insert(ANNOTATION_TRIGGER_DELETION.to_owned(), value);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2024-05-01T11:00:00Z".parse().expect("valid")
    }

    /// docs/machineset.md MD-20.
    #[test]
    fn md_20_stamp_then_mark() {
        let first = plan(
            Some("m-a~2024-05-01T10:00:00Z,m-b,m-c~notatime"),
            None,
            now(),
            |_| Named::Live { marked: false },
        );
        assert_eq!(
            first.deployment_annotations[crate::set::ANNOTATION_SCALER_CHANGE].as_deref(),
            Some("2024-05-01T11:00:00Z")
        );
        assert_eq!(
            first.deployment_annotations[ANNOTATION_TRIGGER_DELETION].as_deref(),
            Some("m-a~2024-05-01T10:00:00Z,m-b~2024-05-01T11:00:00Z,m-c~notatime")
        );
        assert!(first.marks.is_empty());

        let second = plan(
            Some("m-a~2024-05-01T10:00:00Z,m-b~2024-05-01T11:00:00Z,m-c~notatime"),
            Some("2024-05-01T11:00:00Z"),
            now(),
            |name| match name {
                "m-a" => Named::Live { marked: true },
                _ => Named::Live { marked: false },
            },
        );
        assert_eq!(
            second.marks,
            [
                ("m-a".to_owned(), None),
                ("m-b".to_owned(), Some("2024-05-01T11:00:00Z".to_owned()))
            ]
        );
        // m-c is dropped as malformed.
        assert_eq!(
            second.deployment_annotations[ANNOTATION_TRIGGER_DELETION].as_deref(),
            Some("m-a~2024-05-01T10:00:00Z,m-b~2024-05-01T11:00:00Z")
        );
    }

    #[test]
    fn entries_of_missing_or_going_machines_are_dropped_and_an_empty_annotation_removed() {
        let p = plan(
            Some("gone~2024-05-01T10:00:00Z,failed~2024-05-01T10:00:00Z"),
            Some("2024-05-01T10:00:00Z"),
            now(),
            |name| {
                if name == "gone" {
                    Named::Missing
                } else {
                    Named::Going
                }
            },
        );
        assert_eq!(p.deployment_annotations[ANNOTATION_TRIGGER_DELETION], None);
        assert!(p.marks.is_empty());
        assert_eq!(
            plan(None, None, now(), |_| Named::Missing),
            TriggerPlan::default()
        );
    }
}
