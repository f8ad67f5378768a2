//! The one write that brings a Node to its Machine: template labels, annotations and taints, the
//! machine-name label and the Node finalizer, as a JSON patch in which every field it replaces is
//! guarded by a `test` of the value the decision was made from.
//!
//! Why not a resourceVersion guard: the kubelet (here the provider) rewrites a Node's status
//! often, and each of those writes would fail a resourceVersion guard although nothing this
//! patch reads had changed. A `test` of the fields themselves fails only when one of them did
//! change (the answer is then a 422, which the controller kit retries as a stale cache). This
//! is kube-rs's finalizer helper's guard, extended to the other fields written alongside it.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, TestOperation};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use serde_json::Value;

use crate::node_template::Decoration;

/// The patch that gives `node` the labels, annotations and taints of `next` and, when given, the
/// finalizer list `finalizers`; `None` when nothing differs. A field whose value does not change
/// is neither tested nor written.
pub fn node_patch(node: &Node, next: &Decoration, finalizers: Option<&[String]>) -> Option<Patch> {
    let meta = &node.metadata;
    let mut ops = Vec::new();
    let labels = meta.labels.as_ref();
    if labels.cloned().unwrap_or_default() != next.labels {
        replace(&mut ops, &["metadata", "labels"], labels, &next.labels);
    }
    let annotations = meta.annotations.as_ref();
    if annotations.cloned().unwrap_or_default() != next.annotations {
        replace(
            &mut ops,
            &["metadata", "annotations"],
            annotations,
            &next.annotations,
        );
    }
    if let Some(list) = finalizers {
        replace(
            &mut ops,
            &["metadata", "finalizers"],
            meta.finalizers.as_ref(),
            &list,
        );
    }
    let spec = node.spec.as_ref();
    let taints = spec.and_then(|s| s.taints.as_ref());
    if taints.cloned().unwrap_or_default() != next.taints {
        if spec.is_some() {
            replace(&mut ops, &["spec", "taints"], taints, &next.taints);
        } else {
            // `add` needs the parent: a Node read without a spec gets one, unless one appeared.
            replace(
                &mut ops,
                &["spec"],
                None::<&()>,
                &serde_json::json!({"taints": next.taints}),
            );
        }
    }
    (!ops.is_empty()).then_some(Patch(ops))
}

/// A `test` that the field still holds `current` (null: absent), then an `add` of `next`, which
/// sets the field whether or not it exists.
fn replace<C: Serialize, N: Serialize>(
    ops: &mut Vec<PatchOperation>,
    path: &[&str],
    current: Option<&C>,
    next: &N,
) {
    let path = PointerBuf::from_tokens(path.iter().copied());
    ops.push(PatchOperation::Test(TestOperation {
        path: path.clone(),
        value: to_value(current),
    }));
    ops.push(PatchOperation::Add(AddOperation {
        path,
        value: to_value(Some(next)),
    }));
}

fn to_value<T: Serialize>(value: Option<&T>) -> Value {
    // Maps of strings, string lists and Taints always serialise.
    value
        .map(|v| serde_json::to_value(v).unwrap_or(Value::Null))
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn node(labels: Option<&[(&str, &str)]>, finalizers: Option<&[&str]>, spec: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: labels.map(|l| {
                    l.iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect()
                }),
                finalizers: finalizers.map(|f| f.iter().map(|s| (*s).to_owned()).collect()),
                ..ObjectMeta::default()
            },
            spec: spec.then(|| NodeSpec {
                provider_id: Some("sim://n1".into()),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    fn decoration(labels: &[(&str, &str)], taints: &[&str]) -> Decoration {
        Decoration {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            annotations: BTreeMap::new(),
            taints: taints
                .iter()
                .map(|key| Taint {
                    key: (*key).to_owned(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                })
                .collect(),
        }
    }

    /// Applies `patch` as kube-apiserver does: Go's json-patch lets a `test` of null pass on a
    /// missing path, which the Rust crate does not.
    fn apply(node: &Node, patch: &Patch) -> Result<Value, json_patch::PatchError> {
        let mut doc = serde_json::to_value(node).expect("a Node serialises");
        for op in &patch.0 {
            if let PatchOperation::Test(t) = op
                && t.value.is_null()
                && doc.pointer(t.path.as_str()).is_none()
            {
                continue;
            }
            json_patch::patch(&mut doc, std::slice::from_ref(op))?;
        }
        Ok(doc)
    }

    #[test]
    fn a_new_node_gets_label_and_finalizer_each_guarded_by_its_absence() {
        let n = node(None, None, true);
        let next = decoration(&[("node.machine.sapcloud.io/machine-name", "m1")], &[]);
        let finalizers = vec!["machine.sapcloud.io/machine-controller".to_owned()];
        let patch = node_patch(&n, &next, Some(&finalizers)).expect("a change");
        assert_eq!(
            serde_json::to_value(&patch).expect("serialises"),
            json!([
                {"op": "test", "path": "/metadata/labels", "value": null},
                {"op": "add", "path": "/metadata/labels",
                 "value": {"node.machine.sapcloud.io/machine-name": "m1"}},
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers",
                 "value": ["machine.sapcloud.io/machine-controller"]},
            ])
        );
    }

    #[test]
    fn only_changed_fields_are_tested_and_written() {
        let n = node(Some(&[("a", "1")]), Some(&["other"]), true);
        let same = decoration(&[("a", "1")], &[]);
        assert_eq!(node_patch(&n, &same, None), None, "nothing differs");
        let finalizers = vec!["other".to_owned(), "mine".to_owned()];
        let patch = node_patch(&n, &same, Some(&finalizers)).expect("the finalizer");
        let doc = apply(&n, &patch).expect("applies to the node it was made from");
        assert_eq!(doc["metadata"]["finalizers"], json!(["other", "mine"]));
        assert_eq!(doc["metadata"]["labels"], json!({"a": "1"}));
        assert_eq!(patch.0.len(), 2, "labels are neither tested nor written");
    }

    #[test]
    fn a_change_of_a_written_field_fails_the_patch_and_a_status_change_does_not() {
        let read = node(Some(&[("a", "1")]), None, true);
        let next = decoration(&[("a", "1"), ("b", "2")], &["dedicated"]);
        let finalizers = vec!["mine".to_owned()];
        let patch = node_patch(&read, &next, Some(&finalizers)).expect("a change");

        // The kubelet wrote the status meanwhile: the patch still applies, whole.
        let mut status_changed = read.clone();
        status_changed.metadata.resource_version = Some("42".into());
        status_changed.status = Some(Default::default());
        let doc = apply(&status_changed, &patch).expect("status is not guarded");
        assert_eq!(doc["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(doc["spec"]["taints"][0]["key"], "dedicated");
        assert_eq!(
            doc["spec"]["providerID"], "sim://n1",
            "the rest of spec is kept"
        );

        // Someone added a finalizer meanwhile: the patch must not drop it.
        let finalizer_added = node(Some(&[("a", "1")]), Some(&["theirs"]), true);
        assert!(apply(&finalizer_added, &patch).is_err());
        // Someone changed a label meanwhile: the labels written would undo it.
        let label_changed = node(Some(&[("a", "9")]), None, true);
        assert!(apply(&label_changed, &patch).is_err());
    }

    #[test]
    fn a_node_without_spec_gets_one_holding_only_the_taints() {
        let n = node(None, None, false);
        let next = decoration(&[], &["dedicated"]);
        let patch = node_patch(&n, &next, None).expect("a change");
        let doc = apply(&n, &patch).expect("applies");
        assert_eq!(doc["spec"]["taints"][0]["effect"], "NoSchedule");
        // A spec that appeared meanwhile is not replaced.
        assert!(apply(&node(None, None, true), &patch).is_err());
    }
}
