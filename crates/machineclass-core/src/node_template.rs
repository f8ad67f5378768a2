//! Node-template sync: labels, annotations and taints from `spec.nodeTemplate` are applied to the
//! Node; the set applied last time is remembered in the Node annotation
//! `node.machine.sapcloud.io/last-applied-anno-labels-taints`, so keys dropped from the template
//! are removed while keys others added stay.

use std::collections::BTreeMap;

use capstan_apis::machine::{NODE_ANNOTATION_LAST_APPLIED, NodeTemplateSpec};
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

/// Labels, annotations and taints: of a Node, or of a template.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Decoration {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

impl Decoration {
    /// The labels, annotations and taints of a Machine's `spec.nodeTemplate`.
    pub fn of_template(template: Option<&NodeTemplateSpec>) -> Self {
        let meta = template.and_then(|t| t.metadata.as_ref());
        Self {
            labels: meta.and_then(|m| m.labels.clone()).unwrap_or_default(),
            annotations: meta.and_then(|m| m.annotations.clone()).unwrap_or_default(),
            taints: template
                .and_then(|t| t.spec.as_ref())
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        }
    }
}

/// The annotation's JSON shape (MCM's `NodeTemplateSpec` subset).
#[derive(Debug, Default, Serialize, Deserialize)]
struct LastApplied {
    #[serde(default)]
    metadata: LastAppliedMeta,
    #[serde(default)]
    spec: LastAppliedSpec,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LastAppliedMeta {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LastAppliedSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    taints: Vec<Taint>,
}

fn last_applied(node: &Decoration) -> Decoration {
    // An unreadable annotation (written by someone else) is treated as "nothing applied yet".
    let parsed: LastApplied = node
        .annotations
        .get(NODE_ANNOTATION_LAST_APPLIED)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    Decoration {
        labels: parsed.metadata.labels,
        annotations: parsed.metadata.annotations,
        taints: parsed.spec.taints,
    }
}

fn encode(template: &Decoration) -> String {
    let value = LastApplied {
        metadata: LastAppliedMeta {
            labels: template.labels.clone(),
            annotations: template.annotations.clone(),
        },
        spec: LastAppliedSpec {
            taints: template.taints.clone(),
        },
    };
    // Serialising plain maps and taints cannot fail.
    serde_json::to_string(&value).unwrap_or_default()
}

fn same_taint(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

fn sync_map(
    current: &mut BTreeMap<String, String>,
    last: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) {
    for key in last.keys() {
        if !desired.contains_key(key) {
            current.remove(key);
        }
    }
    for (k, v) in desired {
        current.insert(k.clone(), v.clone());
    }
}

/// The Node's new labels, annotations and taints after applying `template`, or `None` when the
/// Node already matches. Taints are identified by key and effect, so one key may carry several
/// effects.
pub fn sync_node_template(node: &Decoration, template: &Decoration) -> Option<Decoration> {
    let last = last_applied(node);
    let mut next = node.clone();
    sync_map(&mut next.labels, &last.labels, &template.labels);
    sync_map(
        &mut next.annotations,
        &last.annotations,
        &template.annotations,
    );
    next.annotations
        .insert(NODE_ANNOTATION_LAST_APPLIED.to_owned(), encode(template));

    next.taints.retain(|t| {
        !last.taints.iter().any(|l| same_taint(l, t))
            || template.taints.iter().any(|d| same_taint(d, t))
    });
    for desired in &template.taints {
        match next.taints.iter_mut().find(|t| same_taint(t, desired)) {
            Some(existing) if existing.value != desired.value => {
                existing.value.clone_from(&desired.value)
            }
            Some(_) => {}
            None => next.taints.push(desired.clone()),
        }
    }
    // The annotation text is compared semantically so that key order in a foreign writer's JSON
    // does not cause a write.
    let unchanged = next.labels == node.labels
        && next.taints == node.taints
        && without_last_applied(&next.annotations) == without_last_applied(&node.annotations)
        && last_applied(node) == *template;
    (!unchanged).then_some(next)
}

fn without_last_applied(map: &BTreeMap<String, String>) -> BTreeMap<&String, &String> {
    map.iter()
        .filter(|(k, _)| *k != NODE_ANNOTATION_LAST_APPLIED)
        .collect()
}

/// The entries of the class's `nodeTemplate.virtualCapacity` that the Node's `status.capacity`
/// lacks or holds with another value (empty: nothing to write).
pub fn virtual_capacity_update(
    capacity: Option<&BTreeMap<String, Quantity>>,
    virtual_capacity: Option<&BTreeMap<String, Quantity>>,
) -> BTreeMap<String, Quantity> {
    virtual_capacity
        .into_iter()
        .flatten()
        .filter(|(k, v)| capacity.and_then(|c| c.get(*k)) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn deco(
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        taints: Vec<Taint>,
    ) -> Decoration {
        Decoration {
            labels: map(labels),
            annotations: map(annotations),
            taints,
        }
    }

    #[test]
    fn adds_template_keys_and_records_them() {
        let node = deco(&[("kubernetes.io/hostname", "n1")], &[], vec![]);
        let template = deco(
            &[("role", "worker")],
            &[("team", "a")],
            vec![taint("dedicated", "gpu", "NoSchedule")],
        );
        let next = sync_node_template(&node, &template).expect("changes");
        assert_eq!(
            next.labels,
            map(&[("kubernetes.io/hostname", "n1"), ("role", "worker")])
        );
        assert_eq!(next.annotations.get("team").map(String::as_str), Some("a"));
        assert_eq!(next.taints, vec![taint("dedicated", "gpu", "NoSchedule")]);
        assert!(next.annotations.contains_key(NODE_ANNOTATION_LAST_APPLIED));
        // Applying again changes nothing.
        assert_eq!(sync_node_template(&next, &template), None);
    }

    #[test]
    fn changes_values_and_removes_only_last_applied_keys() {
        let template_v1 = deco(&[("role", "worker"), ("old", "x")], &[("a1", "1")], vec![]);
        let mut node = sync_node_template(&deco(&[], &[], vec![]), &template_v1).expect("first");
        // Someone else adds their own label and annotation.
        node.labels.insert("foreign".into(), "keep".into());
        node.annotations
            .insert("foreign-anno".into(), "keep".into());
        let template_v2 = deco(&[("role", "infra")], &[], vec![]);
        let next = sync_node_template(&node, &template_v2).expect("changes");
        assert_eq!(next.labels, map(&[("foreign", "keep"), ("role", "infra")]));
        assert!(!next.annotations.contains_key("a1"));
        assert_eq!(
            next.annotations.get("foreign-anno").map(String::as_str),
            Some("keep")
        );
        assert_eq!(sync_node_template(&next, &template_v2), None);
    }

    #[test]
    fn taints_with_same_key_and_different_effects_are_distinct() {
        let template_v1 = deco(
            &[],
            &[],
            vec![
                taint("dedicated", "gpu", "NoSchedule"),
                taint("dedicated", "gpu", "NoExecute"),
            ],
        );
        let mut node = sync_node_template(&deco(&[], &[], vec![]), &template_v1).expect("first");
        assert_eq!(node.taints.len(), 2);
        node.taints.push(taint("foreign", "x", "NoSchedule"));
        // Drop NoExecute, change the NoSchedule value.
        let template_v2 = deco(&[], &[], vec![taint("dedicated", "cpu", "NoSchedule")]);
        let next = sync_node_template(&node, &template_v2).expect("changes");
        assert_eq!(
            next.taints,
            vec![
                taint("dedicated", "cpu", "NoSchedule"),
                taint("foreign", "x", "NoSchedule")
            ]
        );
    }

    #[test]
    fn a_node_without_the_annotation_keeps_unknown_keys() {
        // Without a record of what was applied, nothing is removed.
        let node = deco(
            &[("role", "old")],
            &[(NODE_ANNOTATION_LAST_APPLIED, "not json")],
            vec![],
        );
        let next =
            sync_node_template(&node, &deco(&[("zone", "a")], &[], vec![])).expect("changes");
        assert_eq!(next.labels, map(&[("role", "old"), ("zone", "a")]));
    }

    #[test]
    fn virtual_capacity_fills_missing_or_different_entries_only() {
        let q = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect()
        };
        let node = q(&[("cpu", "2"), ("example.com/dongle", "1")]);
        let virtual_capacity = q(&[
            ("example.com/dongle", "1"),
            ("hc.hana.com/memory", "1234567"),
        ]);
        assert_eq!(
            virtual_capacity_update(Some(&node), Some(&virtual_capacity)),
            q(&[("hc.hana.com/memory", "1234567")])
        );
        assert_eq!(
            virtual_capacity_update(None, Some(&q(&[("x", "2")]))),
            q(&[("x", "2")])
        );
        assert!(virtual_capacity_update(Some(&node), None).is_empty());
        let changed = q(&[("example.com/dongle", "3")]);
        assert_eq!(
            virtual_capacity_update(Some(&node), Some(&changed)),
            changed
        );
    }

    #[test]
    fn template_from_machine_spec() {
        let spec: NodeTemplateSpec = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"role": "worker"}, "annotations": {"a": "b"}},
            "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}
        }))
        .expect("decodes");
        let d = Decoration::of_template(Some(&spec));
        assert_eq!(d.labels, map(&[("role", "worker")]));
        assert_eq!(d.taints, vec![taint("k", "v", "NoSchedule")]);
        assert_eq!(Decoration::of_template(None), Decoration::default());
    }
}
