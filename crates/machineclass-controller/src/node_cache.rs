//! What the Node cache keeps of each Node: the fields this controller's decisions read.
//!
//! A kubelet's Node also carries its image list (up to 50 entries by default), system info,
//! addresses, allocatable, daemon endpoints and volume lists, often most of its size, and
//! none of it is read here. Every Node of the cluster is cached, so those fields are dropped as
//! each watch event arrives; a field the controller starts reading must be kept here too.

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};

/// Keeps all of `metadata` (labels, annotations, finalizers and deletion guard the Node patch
/// and its health), `spec.taints` and `spec.unschedulable` (template sync, drain),
/// `status.capacity` (virtual capacity) and `status.conditions` (health). A present `spec` or
/// `status` stays present: the Node patch adds `/spec` only when the Node has none.
pub fn keep_what_decisions_read(node: &mut Node) {
    if let Some(spec) = node.spec.as_mut() {
        *spec = NodeSpec {
            taints: spec.taints.take(),
            unschedulable: spec.unschedulable,
            ..NodeSpec::default()
        };
    }
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus {
            capacity: status.capacity.take(),
            conditions: status.conditions.take(),
            ..NodeStatus::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kubelet_node() -> Node {
        serde_json::from_value(json!({
            "metadata": {
                "name": "n1",
                "labels": {"node.machine.sapcloud.io/machine-name": "m1"},
                "annotations": {"a": "b"},
                "finalizers": ["node.machine.sapcloud.io/machine-controller-manager"],
                "resourceVersion": "7"
            },
            "spec": {
                "providerID": "sim:///n1",
                "podCIDR": "10.0.0.0/24",
                "taints": [{"key": "k", "effect": "NoSchedule"}],
                "unschedulable": true
            },
            "status": {
                "capacity": {"cpu": "4"},
                "allocatable": {"cpu": "3800m"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "images": [{"names": ["registry.example/app:1"], "sizeBytes": 1}],
                "nodeInfo": {
                    "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
                    "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "",
                    "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""
                }
            }
        }))
        .expect("a valid Node")
    }

    #[test]
    fn keeps_every_field_a_decision_reads_and_drops_the_rest() {
        let full = kubelet_node();
        let mut kept = full.clone();
        keep_what_decisions_read(&mut kept);
        assert_eq!(kept.metadata, full.metadata);
        let (spec, full_spec) = (kept.spec.expect("spec"), full.spec.expect("spec"));
        assert_eq!(spec.taints, full_spec.taints);
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!((spec.provider_id, spec.pod_cidr), (None, None));
        let (status, full_status) = (kept.status.expect("status"), full.status.expect("status"));
        assert_eq!(status.capacity, full_status.capacity);
        assert_eq!(status.conditions, full_status.conditions);
        assert_eq!(status.images, None);
        assert_eq!(status.node_info, None);
        assert_eq!(status.addresses, None);
        assert_eq!(status.allocatable, None);
    }

    #[test]
    fn a_node_without_spec_or_status_stays_without() {
        let mut bare = Node::default();
        keep_what_decisions_read(&mut bare);
        assert_eq!(bare, Node::default());
    }
}
